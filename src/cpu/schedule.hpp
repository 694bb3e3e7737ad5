#pragma once
// How the FAVOR kernels spread (batch, head) work over threads. With at least as many
// heads as threads, each head is one task. With fewer, each head is split into `parts`
// tasks (keys and queries of bidirectional attention, sequence segments of causal
// attention), so that one long sequence also uses every thread.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu/blas.hpp"

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

/// One task per (batch, head): a head is never split over threads, so its sums keep one
/// order and the result is the same bits for any thread count.
inline Schedule heads_only(int64_t heads, int threads) {
  return {heads, 1, heads,
          static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, heads)))};
}

/// One workspace per thread of the team, allocated before the parallel region so that an
/// allocation failure throws to the caller instead of terminating inside OpenMP.
template <class Workspace, class... Args>
std::vector<Workspace> make_workspaces(int team, const Args&... args) {
  std::vector<Workspace> spaces;
  spaces.reserve(static_cast<size_t>(team));
  for (int t = 0; t < team; ++t) spaces.emplace_back(args...);
  return spaces;
}

/// fn(bh, workspace) for every (batch, head) pair, spread over the team (BLAS on the
/// calling thread); returns the sum of fn's results.
template <class Workspace, class Fn>
int64_t for_each_head(const Schedule& plan, std::vector<Workspace>& spaces, Fn fn) {
  int64_t total = 0;
#pragma omp parallel num_threads(plan.team) reduction(+ : total)
  {
    blas_on_calling_thread();
    Workspace& ws = spaces[static_cast<size_t>(omp_get_thread_num())];
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < plan.heads; ++bh) total += fn(bh, ws);
  }
  return total;
}

/// The backward kernels' driver: heads over threads (a head is not split in the backward
/// pass), run_head(bh, workspace) per head. Each head writes its own gradient slices.
template <class Workspace, class RunHead, class... Args>
void backward_over_heads(int64_t heads, int threads, RunHead run_head, const Args&... args) {
  const Schedule plan = heads_only(heads, threads);
  std::vector<Workspace> spaces = make_workspaces<Workspace>(plan.team, args...);
  for_each_head(plan, spaces, [&](int64_t bh, Workspace& ws) {
    run_head(bh, ws);
    return int64_t{0};
  });
}

/// Threads for a decoder's loop over `heads` heads of `work` flops each: one thread below
/// min_total flops in all (default ~50k), where the cost of a parallel region (~a
/// microsecond) would dominate.
inline int threads_for(int64_t heads, double work, int threads, double min_total = 5e4) {
  if (heads < 2 || work * double(heads) < min_total) return 1;
  return static_cast<int>(std::min<int64_t>(threads, heads));
}

/// Start of part `i` of `n` items split into `parts` nearly equal ranges.
inline int64_t split_point(int64_t n, int64_t parts, int64_t i) {
  return n * i / parts;
}

}  // namespace favor::cpu
