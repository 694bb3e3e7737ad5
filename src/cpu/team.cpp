#include "cpu/team.hpp"

#include "core/helper_threads.hpp"
#include "favor/runtime.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>

namespace favor::cpu {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// This thread's CPU time (a system call, ~0.25 us: read by the other threads only, in long
// regions).
int64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

void raise_to(std::atomic<int64_t>& x, int64_t v) {
  int64_t seen = x.load(std::memory_order_relaxed);
  while (v > seen && !x.compare_exchange_weak(seen, v, std::memory_order_relaxed)) {
  }
}

// The first window lasts 50 ms; each window that starts moments after the last one ended
// (the team's try failed again) lasts twice as long, up to 2 s: under a lasting load the
// tries cost one or two late regions (~a scheduler slice, a few ms) per 2 s.
constexpr int64_t kFirstWindowNs = 50'000'000, kLongestWindowNs = 2'000'000'000;
// A thread kept from running this long was descheduled (a hot thread arrives within ~10 us).
constexpr int64_t kSlowedNs = 200'000;
// Regions at least this long (judged by the last one) read the threads' CPU time.
constexpr int64_t kCpuClockFromNs = 100'000;
// After this long without a region of the team its threads sleep (a hot thread arrives within
// ~10 us), and a virtual machine's host may deschedule their idle vCPUs: waking them took
// 0.03-0.3 ms after pauses of 1-10 ms here, 2-4 ms after 20 ms.
constexpr int64_t kColdGapNs = 500'000, kDeepSleepNs = 10'000'000;
constexpr double kLightWakeNs = 300'000, kDeepWakeNs = 4'000'000;
// What an isolated call saves with two threads, counted cautiously: half its time on one
// thread at 50 GFLOP/s (an AVX2 core; AVX-512 ones are faster, so save less).
constexpr double kOneThreadFlopsPerNs = 50.0;

std::atomic<int64_t> g_serial_until{0};  // regions run alone until this time
std::atomic<int64_t> g_window{kFirstWindowNs};
std::atomic<int64_t> g_last_window_end{0};
std::atomic<int> g_strikes{0};            // regions in a row slowed by the load
std::atomic<int64_t> g_last_span{0};      // of the last region of a team
std::atomic<int64_t> g_last_end{0};       // the end of the last region, any team
std::atomic<int64_t> g_last_team_end{0};  // the end of the last region of a team
std::atomic<int64_t> g_team_regions{0};
std::atomic<bool> g_always_wake{false};  // tests
// What the calls run alone since the team last ran would have gained on a warm team (ns), and
// when the last of them added to it.
std::atomic<int64_t> g_forgone{0};
std::atomic<int64_t> g_forgone_at{0};

// A region of the team (or a loop outside the kernels on it) ended at `end`: the team is awake.
void team_ended(int64_t end) {
  g_last_team_end.store(end, std::memory_order_relaxed);
  g_forgone.store(0, std::memory_order_relaxed);
}

void condemn(int64_t now) {
  const int64_t last_end = g_last_window_end.load(std::memory_order_relaxed);
  int64_t window = g_window.load(std::memory_order_relaxed);
  // Tried again right after a window (within one more window): the load lasts, wait longer.
  if (last_end != 0 && now - last_end < window) window = std::min(2 * window, kLongestWindowNs);
  g_window.store(window, std::memory_order_relaxed);
  g_last_window_end.store(now + window, std::memory_order_relaxed);
  g_serial_until.store(now + window, std::memory_order_relaxed);
  g_strikes.store(0, std::memory_order_relaxed);
  if (const char* log = std::getenv("FAVOR_TEAM_LOG"); log != nullptr && *log != '\0')
    std::fprintf(stderr, "favor: threads kept waiting by the load: one thread for %.0f ms\n",
                 double(window) / 1e6);
}

}  // namespace

int team_now(int planned, double flops) {
  if (planned <= 1) return 1;
  const int64_t now = now_ns();
  if (now < g_serial_until.load(std::memory_order_relaxed)) return 1;
  const int64_t slept = now - g_last_team_end.load(std::memory_order_relaxed);
  if (slept <= kColdGapNs || g_always_wake.load(std::memory_order_relaxed)) return planned;
  // Calls back to back (this one starts as the last one ended): wake the team once for all.
  if (now - g_last_end.load(std::memory_order_relaxed) <= kColdGapNs) return planned;
  // An isolated call after a pause: the team sleeps; wake it only when it saves more.
  const double saves = flops / kOneThreadFlopsPerNs / 2.0;
  if (slept < kDeepSleepNs) return saves > kLightWakeNs ? planned : 1;
  if (saves > kDeepWakeNs) return planned;
  // Deeply asleep, and this call alone does not pay the wake-up. But calls that a warm team
  // would serve (each saves more than a light wake-up) keep it warm once woken, as long as they
  // come less than a deep sleep apart: what they would have gained adds up, and the team is
  // woken once it exceeds the deep wake-up. (Left to each call alone, such a loop never woke
  // it: every call found the team asleep since the last one that used it.)
  if (saves <= kLightWakeNs) return 1;  // too small for a warm team: never adds up
  int64_t forgone = g_forgone.load(std::memory_order_relaxed);
  if (now - g_forgone_at.load(std::memory_order_relaxed) > kDeepSleepNs) forgone = 0;
  forgone += static_cast<int64_t>(saves - kLightWakeNs);
  if (double(forgone) > kDeepWakeNs) {
    g_forgone.store(0, std::memory_order_relaxed);
    return planned;
  }
  g_forgone.store(forgone, std::memory_order_relaxed);
  g_forgone_at.store(now, std::memory_order_relaxed);
  return 1;
}

bool team_contended() {
  return now_ns() < g_serial_until.load(std::memory_order_relaxed);
}

void reset_team_state() {
  g_serial_until.store(0);
  g_window.store(kFirstWindowNs);
  g_last_window_end.store(0);
  g_strikes.store(0);
  g_last_span.store(0);
  g_last_end.store(0);
  g_last_team_end.store(0);
  g_forgone.store(0);
  g_forgone_at.store(0);
}

int64_t team_regions() {
  return g_team_regions.load(std::memory_order_relaxed);
}

void always_wake_team_for_test(bool on) {
  g_always_wake.store(on, std::memory_order_relaxed);
}

void run_alone_for(int64_t ns) {
  g_serial_until.store(now_ns() + ns, std::memory_order_relaxed);
}

RegionClock::RegionClock(int team) : team_(team) {
  if (team_ <= 1) return;
  cpu_ = g_last_span.load(std::memory_order_relaxed) >= kCpuClockFromNs;
  begin_ = now_ns();
  cold_ = begin_ - g_last_team_end.load(std::memory_order_relaxed) > kColdGapNs;
}

int64_t RegionClock::arrive() noexcept {
  if (team_ <= 1 || omp_get_thread_num() == 0) return 0;
  const int64_t wall = now_ns();
  if (cold_) raise_to(pre_arrival_, wall - begin_);  // a wake-up: not judged
  return cpu_ ? thread_cpu_ns() : wall;
}

void RegionClock::done(int64_t arrived) noexcept {
  if (team_ <= 1) return;
  const int64_t now = now_ns();
  if (omp_get_thread_num() == 0) {
    master_done_ = now;
    return;
  }
  // From the region's start to now, less what this thread ran: how long it was kept waiting
  // (to wake up, or for its core); in a short region, the wait before it arrived. A cold
  // team's wake-up is left out.
  const int64_t woke = cold_ ? pre_arrival_.load(std::memory_order_relaxed) : 0;
  int64_t waited = cold_ ? 0 : arrived - begin_;
  if (cpu_) {
    const int64_t ran = thread_cpu_ns() - arrived;
    worker_cpu_.fetch_add(ran, std::memory_order_relaxed);
    waited = (now - begin_) - ran - woke;
  }
  raise_to(kept_waiting_, waited);
}

RegionClock::~RegionClock() {
  const int64_t end = now_ns();
  g_last_end.store(end, std::memory_order_relaxed);
  if (team_ <= 1) return;
  g_team_regions.fetch_add(1, std::memory_order_relaxed);
  const int64_t span = end - begin_;
  g_last_span.store(span, std::memory_order_relaxed);
  team_ended(end);
  const int64_t waited = kept_waiting_.load(std::memory_order_relaxed);
  const int64_t alone = (master_done_ > begin_ ? master_done_ - begin_ : span) +
                        worker_cpu_.load(std::memory_order_relaxed);
  const bool paid = cpu_ && 10 * span < 9 * alone;
  if (waited < kSlowedNs || paid) {  // not slowed by the load, or the team paid all the same
    g_strikes.store(0, std::memory_order_relaxed);
    return;
  }
  const int64_t last_end = g_last_window_end.load(std::memory_order_relaxed);
  const bool just_tried =
      last_end != 0 && end - last_end < g_window.load(std::memory_order_relaxed);
  const int strikes = g_strikes.fetch_add(1, std::memory_order_relaxed) + 1;
  // Two in a row: a virtual machine's host also stalls a thread now and then (~4 ms here, on
  // an idle guest), which one region absorbs; a load stalls every region.
  if (just_tried || strikes >= 2) condemn(end);
}

}  // namespace favor::cpu

namespace favor::detail {

int helper_team() {
  return cpu::team_contended() ? 1 : favor::num_threads();
}

void team_ran(int team) {
  if (team <= 1) return;
  const int64_t end = cpu::now_ns();
  cpu::g_last_end.store(end, std::memory_order_relaxed);
  cpu::team_ended(end);
}

}  // namespace favor::detail
