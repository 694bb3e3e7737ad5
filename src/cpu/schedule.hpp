#pragma once
// How the FAVOR kernels spread (batch, head) work over threads. With at least as many
// heads as threads, each head is one task. With fewer, each head is split into `parts`
// tasks (keys and queries of bidirectional attention, sequence segments of causal
// attention), so that one long sequence also uses every thread.
#include <algorithm>
#include <cstdint>

namespace favor::cpu {

struct Schedule {
  int64_t heads, parts, tasks;
  int team;  // threads in the parallel region
};

inline Schedule make_schedule(int64_t heads, int threads) {
  const int64_t parts = heads >= threads ? 1 : threads / heads;
  const int64_t tasks = heads * parts;
  return {heads, parts, tasks, static_cast<int>(std::min<int64_t>(threads, tasks))};
}

/// Start of part `i` of `n` items split into `parts` nearly equal ranges.
inline int64_t split_point(int64_t n, int64_t parts, int64_t i) {
  return n * i / parts;
}

}  // namespace favor::cpu
