#pragma once
// How the FAVOR kernels spread (batch, head) work over threads. With at least as many
// heads as threads, each head is one task. With fewer, each head is split into `parts`
// tasks (keys and queries of bidirectional attention, sequence segments of causal
// attention), so that one long sequence also uses every thread.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

#include "cpu/blas.hpp"
#include "cpu/team.hpp"

namespace favor::cpu {

struct Schedule {
  int64_t heads, parts, tasks;
  int team;             // threads in the parallel region (planned: cpu/team.hpp may use one)
  double flops = 1e30;  // the work of the whole region, where known (cpu/team.hpp)
};

inline Schedule make_schedule(int64_t heads, int threads) {
  const int64_t parts = heads >= threads ? 1 : threads / heads;
  const int64_t tasks = heads * parts;
  return {heads, parts, tasks, static_cast<int>(std::min<int64_t>(threads, tasks))};
}

/// Flops of a whole call below which it runs on the calling thread alone: waking the team
/// (a futex wake per thread when they sleep, their spin-wait afterwards, competing with the
/// caller's own threads) costs more than the second thread saves. Measured with
/// `favor bench --sections calls` (docs/performance.md, "Per-call overhead").
constexpr double kSerialFlops = 4e6;

/// make_schedule for a call of `flops` in all: one thread below kSerialFlops.
inline Schedule make_schedule(int64_t heads, int threads, double flops) {
  Schedule plan = make_schedule(heads, flops < kSerialFlops ? 1 : threads);
  plan.flops = flops;
  return plan;
}

/// One task per (batch, head): a head is never split over threads, so its sums keep one
/// order and the result is the same bits for any thread count.
inline Schedule heads_only(int64_t heads, int threads, double flops = 1e30) {
  return {heads, 1, heads,
          static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, heads))), flops};
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

/// Workspaces lent by the calling thread's shelf (lend_workspaces), or owned when the shelf
/// was in use (a kernel called from inside another of the same kind).
template <class Workspace>
class LentWorkspaces {
 public:
  explicit LentWorkspaces(std::vector<Workspace>* shelf, bool* in_use)
      : spaces_(shelf), in_use_(in_use) {}
  explicit LentWorkspaces(std::vector<Workspace> own) : own_(std::move(own)), spaces_(&own_) {}
  LentWorkspaces(const LentWorkspaces&) = delete;
  LentWorkspaces& operator=(const LentWorkspaces&) = delete;
  ~LentWorkspaces() {
    if (in_use_) *in_use_ = false;
  }
  std::vector<Workspace>& spaces() { return *spaces_; }

 private:
  std::vector<Workspace> own_;
  std::vector<Workspace>* spaces_;
  bool* in_use_ = nullptr;
};

/// make_workspaces, kept between calls: each calling thread has a shelf per workspace type
/// holding the workspaces of its last call, reused (not re-zeroed: workspaces are scratch
/// written before they are read) while the arguments are the same, grown when the team is
/// larger, rebuilt when the arguments change, freed at thread exit. A tiny call then
/// allocates and clears nothing. Only for workspaces whose size does not depend on the
/// sequence length (tiles, states): a shelf holds its last size until the thread ends.
template <class Workspace, class... Args>
LentWorkspaces<Workspace> lend_workspaces(int team, const Args&... args) {
  struct Shelf {
    std::vector<Workspace> spaces;
    std::tuple<Args...> key;
    bool in_use = false;
  };
  thread_local Shelf shelf;
  if (shelf.in_use) return LentWorkspaces<Workspace>(make_workspaces<Workspace>(team, args...));
  const std::tuple<Args...> key{args...};
  if (!(shelf.key == key)) {
    shelf.spaces.clear();
    shelf.key = key;
  }
  if (shelf.spaces.size() < static_cast<size_t>(team)) {
    shelf.spaces.reserve(static_cast<size_t>(team));
    while (shelf.spaces.size() < static_cast<size_t>(team)) shelf.spaces.emplace_back(args...);
  }
  shelf.in_use = true;
  return LentWorkspaces<Workspace>(&shelf.spaces, &shelf.in_use);
}

/// Runs fn on the calling thread with OpenMP's thread count (the one BLAS reads) set to 1,
/// restoring the caller's setting after: the serial path of a small call, no parallel region.
template <class Fn>
auto on_calling_thread(Fn fn) {
  struct Restore {
    int threads = omp_get_max_threads();
    ~Restore() { omp_set_num_threads(threads); }
  } restore;
  omp_set_num_threads(1);
  return fn();
}

/// fn(bh, workspace) for every (batch, head) pair, spread over the team (BLAS on the
/// calling thread); returns the sum of fn's results. A team of one runs on the calling
/// thread without a parallel region.
/// The team is plan.team, or 1 while the machine is contended (cpu/team.hpp).
template <class Workspace, class Fn>
int64_t for_each_head(const Schedule& plan, std::vector<Workspace>& spaces, Fn fn) {
  const int team = team_now(plan.team, plan.flops);
  RegionClock clock(team);
  if (team == 1) {
    return on_calling_thread([&] {
      int64_t total = 0;
      for (int64_t bh = 0; bh < plan.heads; ++bh) total += fn(bh, spaces[0]);
      return total;
    });
  }
  int64_t total = 0;
#pragma omp parallel num_threads(team) reduction(+ : total)
  {
    const int64_t arrived = clock.arrive();
    blas_on_calling_thread();
    Workspace& ws = spaces[static_cast<size_t>(omp_get_thread_num())];
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t bh = 0; bh < plan.heads; ++bh) total += fn(bh, ws);
    clock.done(arrived);
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
