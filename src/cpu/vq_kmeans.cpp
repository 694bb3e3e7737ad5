#include "cpu/vq_kmeans.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "core/rng.hpp"
#include "cpu/blas.hpp"
#include "cpu/team.hpp"
#include "cpu/vec_math.hpp"

namespace favor::cpu {
namespace {

// A uniform index in [0, n).
int64_t uniform_index(detail::Rng& rng, int64_t n) {
  return std::min(n - 1, static_cast<int64_t>(rng.uniform_open() * static_cast<double>(n)));
}

// fn(g, thread) for every group with active[g], groups over at most `threads` threads.
template <class Fn>
void for_each_group(int64_t groups, int team, const std::vector<uint8_t>& active, Fn fn) {
  team = team_now(team);  // one thread while contended (cpu/team.hpp)
  RegionClock clock(team);
#pragma omp parallel num_threads(team)
  {
    const int64_t arrived = clock.arrive();
    blas_on_calling_thread();
    const int thread = omp_get_thread_num();
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t g = 0; g < groups; ++g)
      if (active[g]) fn(g, thread);
    clock.done(arrived);
  }
}

}  // namespace

KMeans::KMeans(const KeyGroups& keys, int64_t codes, int threads)
    : keys_(keys),
      codes_(codes),
      threads_(threads),
      codebook_(static_cast<size_t>(keys.groups * codes * keys.d)),
      z_(keys.rows.size() / static_cast<size_t>(keys.d)),
      last_z_(z_.size()),
      dist2_(z_.size()),
      error_(static_cast<size_t>(keys.groups)),
      active_(static_cast<size_t>(keys.groups), 1),
      updated_(static_cast<size_t>(keys.groups), 0) {}

void KMeans::seed(uint64_t seed) {
  const int team = static_cast<int>(std::clamp<int64_t>(keys_.groups, 1, threads_));
  int64_t largest = 0;
  for (int64_t g = 0; g < keys_.groups; ++g) largest = std::max(largest, keys_.size(g));
  std::vector<std::vector<float>> work(static_cast<size_t>(team),
                                       std::vector<float>(static_cast<size_t>(2 * largest)));
  std::fill(active_.begin(), active_.end(), 1);
  std::fill(updated_.begin(), updated_.end(), 0);
  for_each_group(keys_.groups, team, active_, [&](int64_t g, int thread) {
    // dist2_ of the group holds the distance to the nearest code so far.
    seed_group(g, seed, dist2_.data() + keys_.start[g], work[thread].data());
  });
}

void KMeans::start_from(const float* codebook) {
  std::copy_n(codebook, codebook_.size(), codebook_.begin());
  std::fill(active_.begin(), active_.end(), 1);
  std::fill(updated_.begin(), updated_.end(), 0);
}

void KMeans::seed_group(int64_t g, uint64_t seed, float* dist2, float* work) {
  const int64_t n = keys_.size(g), d = keys_.d;
  const float* x = keys_.row(keys_.start[g]);
  float* codes = codebook_.data() + g * codes_ * d;
  float* norms = work;         // |x_r|^2
  float* products = work + n;  // x_r . C_s
  for (int64_t r = 0; r < n; ++r) norms[r] = dot(x + r * d, x + r * d, d);
  // Distances to a new code from one matrix-vector product (|x|^2 + |C|^2 - 2 x.C): the
  // rounding only perturbs the draw weights of keys next to a code; the chosen key itself
  // gets exactly 0, so it is never drawn again.
  auto add_code = [&](int64_t s, int64_t pick) {
    float* code = codes + s * d;
    std::copy_n(x + pick * d, d, code);
    gemm(false, false, n, 1, d, 1.0f, x, d, code, 1, 0.0f, products, 1);
    for (int64_t r = 0; r < n; ++r) {
      const float e = std::max(0.0f, norms[r] + norms[pick] - 2.0f * products[r]);
      dist2[r] = s == 0 ? e : std::min(dist2[r], e);
    }
    dist2[pick] = 0.0f;
  };
  detail::Rng rng(seed, static_cast<uint64_t>(g));
  add_code(0, uniform_index(rng, n));
  for (int64_t s = 1; s < codes_; ++s) {
    double total = 0.0;
    for (int64_t r = 0; r < n; ++r) total += dist2[r];
    int64_t pick = -1;
    if (total > 0.0) {
      // The first key where the running sum passes u * total; the last key of positive
      // weight if rounding leaves the sum short.
      const double target = rng.uniform_open() * total;
      double sum = 0.0;
      for (int64_t r = 0; r < n && sum <= target; ++r) {
        if (dist2[r] <= 0.0f) continue;
        sum += dist2[r];
        pick = r;
      }
    } else {
      pick = uniform_index(rng, n);  // every key is already a code: duplicates are all left
    }
    add_code(s, pick);
  }
}

double KMeans::assign() {
  assign_groups(keys_, codebook_.data(), codes_ * keys_.d, codes_, threads_, z_.data(),
                dist2_.data(), active_.data());
  double mean = 0.0;
  for (int64_t g = 0; g < keys_.groups; ++g) {
    const int64_t lo = keys_.start[g], hi = keys_.start[g + 1];
    if (active_[g]) {
      double sum = 0.0;
      for (int64_t r = lo; r < hi; ++r) sum += dist2_[r];
      error_[g] = sum / static_cast<double>(hi - lo);
      // Codes that are the means of this very assignment are a fixed point: done.
      if (updated_[g] && std::equal(z_.begin() + lo, z_.begin() + hi, last_z_.begin() + lo))
        active_[g] = 0;
    }
    mean += error_[g];
  }
  return mean / static_cast<double>(keys_.groups);
}

void KMeans::update() {
  const int team = static_cast<int>(std::clamp<int64_t>(keys_.groups, 1, threads_));
  int64_t largest = 0;
  for (int64_t g = 0; g < keys_.groups; ++g) largest = std::max(largest, keys_.size(g));
  struct Workspace {
    std::vector<double> sums;
    std::vector<int64_t> counts, order;
  };
  std::vector<Workspace> spaces(static_cast<size_t>(team));
  for (Workspace& ws : spaces) {
    ws.sums.resize(static_cast<size_t>(codes_ * keys_.d));
    ws.counts.resize(static_cast<size_t>(codes_));
    ws.order.reserve(static_cast<size_t>(largest));
  }
  for_each_group(keys_.groups, team, active_, [&](int64_t g, int thread) {
    Workspace& ws = spaces[static_cast<size_t>(thread)];
    update_group(g, ws.sums.data(), ws.counts.data(), ws.order);
  });
}

void KMeans::update_group(int64_t g, double* sums, int64_t* counts, std::vector<int64_t>& order) {
  const int64_t lo = keys_.start[g], hi = keys_.start[g + 1], d = keys_.d;
  std::fill_n(sums, codes_ * d, 0.0);
  std::fill_n(counts, codes_, int64_t{0});
  int64_t empty = codes_;
  for (int64_t r = lo; r < hi; ++r) {
    const int32_t s = z_[r];
    empty -= counts[s]++ == 0;
    const float* x = keys_.row(r);
    for (int64_t t = 0; t < d; ++t) sums[s * d + t] += x[t];
  }
  std::copy(z_.begin() + lo, z_.begin() + hi, last_z_.begin() + lo);
  if (empty > 0) {
    // Farthest keys first (ties: lower row). Clusters keep >= 1 key, so there are enough:
    // sum over clusters of (size - 1) = n - (codes - empty) >= empty as n >= codes.
    order.resize(static_cast<size_t>(hi - lo));
    for (int64_t r = lo; r < hi; ++r) order[r - lo] = r;
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return dist2_[a] > dist2_[b]; });
    size_t next = 0;
    for (int64_t s = 0; s < codes_; ++s) {
      if (counts[s] != 0) continue;
      while (next < order.size() && counts[last_z_[order[next]]] < 2) ++next;
      if (next == order.size()) break;  // not reached (see above)
      const int64_t r = order[next++];
      const int32_t from = last_z_[r];
      const float* x = keys_.row(r);
      --counts[from];
      counts[s] = 1;
      for (int64_t t = 0; t < d; ++t) {
        sums[from * d + t] -= x[t];
        sums[s * d + t] = x[t];
      }
      last_z_[r] = static_cast<int32_t>(s);
    }
  }
  float* codes = codebook_.data() + g * codes_ * d;
  for (int64_t s = 0; s < codes_; ++s)
    for (int64_t t = 0; t < d; ++t)
      if (counts[s] > 0) codes[s * d + t] = static_cast<float>(sums[s * d + t] / counts[s]);
  updated_[g] = 1;
}

}  // namespace favor::cpu
