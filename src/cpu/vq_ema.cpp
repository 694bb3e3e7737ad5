#include "cpu/vq_ema.hpp"

#include <omp.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "core/rng.hpp"
#include "cpu/blas.hpp"
#include "cpu/team.hpp"

namespace favor::cpu {
namespace {

struct Workspace {
  std::vector<double> sums;  // this update's per-code key sums
  std::vector<int64_t> counts, keys;
};

// Codes unused for dead_after updates take keys drawn without replacement (a partial
// Fisher-Yates shuffle), with replacement only once every key is taken.
int64_t reseed_dead(const KeyGroups& keys, int64_t g, const EMAParams& p, Workspace& ws) {
  const int64_t n = keys.size(g), base = g * p.codes;
  if (p.dead_after == 0 || n == 0) return 0;
  int64_t dead = 0;
  for (int64_t s = 0; s < p.codes; ++s) dead += p.unused[base + s] >= p.dead_after;
  if (dead == 0) return 0;
  detail::Rng rng(p.seed, static_cast<uint64_t>(g));
  const int64_t draws = std::min(dead, n);
  ws.keys.resize(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) ws.keys[r] = r;
  for (int64_t slot = 0; slot < draws; ++slot) {
    const int64_t left = n - slot;
    const auto step = static_cast<int64_t>(rng.uniform_open() * static_cast<double>(left));
    std::swap(ws.keys[slot], ws.keys[slot + std::min(left - 1, step)]);
  }
  int64_t k = 0;
  for (int64_t s = 0; s < p.codes; ++s) {
    if (p.unused[base + s] < p.dead_after) continue;
    const float* key = keys.row(keys.start[g] + ws.keys[k++ % draws]);
    std::copy_n(key, p.d, p.ema_sum + (base + s) * p.d);
    std::copy_n(key, p.d, p.codebook + (base + s) * p.d);
    p.ema_count[base + s] = 1.0f;
    p.unused[base + s] = 0;
  }
  return dead;
}

int64_t update_group(const KeyGroups& keys, int64_t g, const int32_t* z, const EMAParams& p,
                     Workspace& ws) {
  const int64_t d = p.d, base = g * p.codes;
  std::fill(ws.sums.begin(), ws.sums.end(), 0.0);
  std::fill(ws.counts.begin(), ws.counts.end(), int64_t{0});
  for (int64_t r = keys.start[g]; r < keys.start[g + 1]; ++r) {
    const int64_t s = z[r];
    ++ws.counts[s];
    const float* x = keys.row(r);
    for (int64_t t = 0; t < d; ++t) ws.sums[s * d + t] += x[t];
  }
  const double keep = p.decay, gain = 1.0 - p.decay;
  for (int64_t s = 0; s < p.codes; ++s) {
    const double count = keep * p.ema_count[base + s] + gain * double(ws.counts[s]);
    const double inv = 1.0 / std::max(count, p.eps);
    float* sum = p.ema_sum + (base + s) * d;
    float* code = p.codebook + (base + s) * d;
    for (int64_t t = 0; t < d; ++t) {
      const double value = keep * sum[t] + gain * ws.sums[s * d + t];
      sum[t] = static_cast<float>(value);
      code[t] = static_cast<float>(value * inv);
    }
    p.ema_count[base + s] = static_cast<float>(count);
    p.unused[base + s] = ws.counts[s] == 0 ? p.unused[base + s] + 1 : 0;
  }
  return reseed_dead(keys, g, p, ws);
}

}  // namespace

int64_t codebook_ema(const KeyGroups& keys, const EMAParams& p, const Config& config) {
  const int64_t total = keys.start[keys.groups];
  std::vector<int32_t> z(static_cast<size_t>(total));
  std::vector<float> dist2(static_cast<size_t>(total));
  assign_groups(keys, p.codebook, p.codes * p.d, p.codes, config.threads, z.data(), dist2.data());
  const int team = static_cast<int>(std::clamp<int64_t>(keys.groups, 1, config.threads));
  std::vector<Workspace> spaces(static_cast<size_t>(team));
  int64_t largest = 0;
  for (int64_t g = 0; g < keys.groups; ++g) largest = std::max(largest, keys.size(g));
  for (Workspace& ws : spaces) {
    ws.sums.resize(static_cast<size_t>(p.codes * p.d));
    ws.counts.resize(static_cast<size_t>(p.codes));
    ws.keys.reserve(static_cast<size_t>(largest));
  }
  int64_t reseeded = 0;
  const int now = team_now(team);  // one thread while contended (cpu/team.hpp)
  RegionClock clock(now);
#pragma omp parallel num_threads(now) reduction(+ : reseeded)
  {
    const int64_t arrived = clock.arrive();
    blas_on_calling_thread();
    Workspace& ws = spaces[static_cast<size_t>(omp_get_thread_num())];
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t g = 0; g < keys.groups; ++g) reseeded += update_group(keys, g, z.data(), p, ws);
    clock.done(arrived);
  }
  return reseeded;
}

}  // namespace favor::cpu
