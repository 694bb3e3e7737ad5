#include "cpu/vq_key_groups.hpp"

#include <omp.h>

#include <algorithm>

#include "cpu/blas.hpp"
#include "cpu/team.hpp"
#include "cpu/vq_assign.hpp"

namespace favor::cpu {

KeyGroups gather_keys(const TensorView& keys, const std::optional<KeyMaskView>& mask, bool pooled) {
  KeyGroups out;
  out.d = keys.shape[3];
  out.groups = pooled ? 1 : keys.shape[1];
  out.start.assign(static_cast<size_t>(out.groups + 1), 0);
  int64_t total = 0;
  for_each_key(keys, mask, pooled, [&](int64_t g, int64_t, int64_t, int64_t) {
    ++out.start[g + 1];
    ++total;
  });
  for (int64_t g = 0; g < out.groups; ++g) out.start[g + 1] += out.start[g];
  out.rows.resize(static_cast<size_t>(total * out.d));
  float* dst = out.rows.data();
  for_each_key(keys, mask, pooled, [&](int64_t, int64_t b, int64_t h, int64_t n) {
    for (int64_t x = 0; x < out.d; ++x) *dst++ = keys.at(b, h, n, x);
  });
  return out;
}

void assign_groups(const KeyGroups& keys, const float* codebook, int64_t codebook_stride,
                   int64_t codes, int threads, int32_t* z, float* dist2, const uint8_t* active) {
  // Tasks are (group, tile) pairs, so that one pooled group also uses every thread.
  std::vector<int64_t> task_group, task_row;
  std::vector<CodeTable> tables(static_cast<size_t>(keys.groups));
  for (int64_t g = 0; g < keys.groups; ++g) {
    if (active && !active[g]) continue;
    tables[g] = code_table(codebook + g * codebook_stride, codes, keys.d);
    for (int64_t r = keys.start[g]; r < keys.start[g + 1]; r += kAssignTile) {
      task_group.push_back(g);
      task_row.push_back(r);
    }
  }
  const int64_t tasks = static_cast<int64_t>(task_group.size());
  const int team = static_cast<int>(std::clamp<int64_t>(tasks, 1, threads));
  std::vector<std::vector<float>> scratch(static_cast<size_t>(team),
                                          std::vector<float>(kAssignTile * codes));
  const int now = team_now(team);  // one thread while contended (cpu/team.hpp)
  RegionClock clock(now);
#pragma omp parallel num_threads(now)
  {
    const int64_t arrived = clock.arrive();
    blas_on_calling_thread();
    float* ws = scratch[static_cast<size_t>(omp_get_thread_num())].data();
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t g = task_group[t], r = task_row[t];
      const int64_t n = std::min(kAssignTile, keys.start[g + 1] - r);
      nearest_codes(keys.row(r), keys.d, n, tables[g], z + r, dist2 + r, ws);
    }
    clock.done(arrived);
  }
}

}  // namespace favor::cpu
