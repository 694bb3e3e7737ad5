#pragma once
// Load-aware teams (docs/performance.md, "No cliff under load"). An OpenMP parallel region
// ends when its slowest thread does: when another process holds a thread's core, the region
// waits for the scheduler to give it back, milliseconds on a busy machine (a decode step of
// 20 us took 8 ms). So each region of more than one thread is judged:
// - was a thread kept from running? Its wall time from the region's start to the end of its
//   share, less the CPU time it spent: a descheduled thread waits a scheduler slice,
//   milliseconds. Kept waiting 200 us or more is the load's doing.
// - and did the team still pay? One thread alone would have needed the calling thread's own
//   span plus the CPU time of the others; the region took at least 0.9 of that.
// Reading a thread's CPU time is a system call (~0.25 us), so in short regions (the last one
// under 100 us) only the wait before a thread arrived is counted, and a 200 us wait there is
// always a loss. After two such regions in a row (one if the last window ended moments ago;
// a lone stall, as a virtual machine's host causes now and then, is absorbed), regions run on the
// calling thread alone for a while (50 ms, doubling while the load lasts, up to 2 s); then the team
// is tried again. FAVOR_TEAM_LOG=1 prints each window on stderr.
// Waking a team that has slept is not load: after more than 0.5 ms without a region its
// threads stop spinning and sleep, and a virtual machine's host may deschedule their idle
// vCPUs (measured here: 0.03-0.3 ms to wake after a 1-10 ms pause, 2-4 ms after 20 ms). Such
// a region's wait before its threads arrive is not judged. Calls back to back wake the team
// once for all; an isolated call after a pause uses it only when half its time on one
// thread (counted at 50 GFLOP/s) exceeds the wake-up (0.3 ms, 4 ms after 10 ms asleep): a
// decode step between two Python statements runs on the calling thread. Calls that a warm team
// would serve (each saves more than a light wake-up) but that do not pay a deep one add up what
// each would gain on a warm team (its saving less a light wake-up) while each comes less than
// 10 ms after the last one that added (a loop of mid-sized calls with other work between them,
// as a Python loop has): once the sum exceeds the deep wake-up, the team is woken, and the calls
// after it find it warm. A loop outside the kernels that ran on the team (the input scan, a
// fingerprint, a page fill: detail::team_ran, core/helper_threads.hpp) wakes it as well. The
// state is the process's, shared by every calling thread (each has its own OpenMP pool; under
// several callers the rules are approximate: one wake-up too many or too few). Imbalanced work (a
// thread with little to do, never kept waiting) is not load and is left alone. A team of one
// runs the same decomposition (parts, tasks and groups come from the configured threads,
// never from the team), so results do not depend on the team.
#include <omp.h>

#include <atomic>
#include <cstdint>

namespace favor::cpu {

/// The threads a region planned for `planned` threads, of `flops` in all (as far as known),
/// runs on now: `planned`, or 1 while the machine is found contended or when a small call
/// follows a pause.
int team_now(int planned, double flops = 1e30);

/// Times one parallel region: construct it before the region (also for a team of one: its end
/// tells the next call whether calls come back to back); every thread calls
/// `const auto t = clock.arrive();` first thing inside and `clock.done(t)` when its share is
/// over; the destructor judges the region. A region of one thread is not judged.
class RegionClock {
 public:
  explicit RegionClock(int team);
  ~RegionClock();
  RegionClock(const RegionClock&) = delete;
  RegionClock& operator=(const RegionClock&) = delete;

  int64_t arrive() noexcept;
  void done(int64_t arrived) noexcept;

 private:
  int team_;
  bool cpu_ = false;   // read the threads' CPU time (a long region)
  bool cold_ = false;  // the team slept before it: its wake-up is not judged
  int64_t begin_ = 0, master_done_ = 0;
  std::atomic<int64_t> kept_waiting_{0};  // the longest time a thread was kept from running
  std::atomic<int64_t> worker_cpu_{0};    // the other threads' CPU time (long regions)
  std::atomic<int64_t> pre_arrival_{0};   // a cold team's wake-up (not judged)
};

/// Whether regions run on the calling thread now (a contended window), for benchmarks.
bool team_contended();

/// Forgets what was learnt (tests).
void reset_team_state();

/// Regions run on the calling thread for the next `ns` nanoseconds, as under a load (tests).
void run_alone_for(int64_t ns);

/// Tests: while set, a region outside a window always uses its planned team (no judgement of
/// pauses), whatever the timing (sanitizer builds are slow).
void always_wake_team_for_test(bool on);

/// Regions of more than one thread run so far in this process (tests).
int64_t team_regions();

}  // namespace favor::cpu
