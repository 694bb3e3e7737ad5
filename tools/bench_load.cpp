// favor bench --sections load: the rows a busy machine hurts (docs/performance.md, "No cliff
// under load"): a decode step of one sequence, a tiny call and N = 1024 calls, on 1 thread and
// on all, with the machine idle, with one other process busy on a core ("busy", the same
// priority), and with that process favoured by the scheduler ("heavy": its nice -10, so it
// gets ~90% of the core it shares; as on machines where a busy neighbour wins every slice).
// The state_rw row is a plain OpenMP loop (tools/bench_decode.cpp), the reference of what a
// region that waits for every thread costs under the same load.
#include <fmt/core.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "bench_runner.hpp"

namespace favor::cli {

void decode_step_row(BenchRunner& bench, int64_t position, int threads);  // bench_decode.cpp
void state_rw_row(BenchRunner& bench, int threads);                       // bench_decode.cpp

namespace {

// Another process spinning on one core for the scope (none for "idle"). Returns whether it
// runs as asked: "heavy" needs the right to lower its nice value (root or CAP_SYS_NICE).
class Competitor {
 public:
  explicit Competitor(const std::string& load) {
    if (load == "idle") return;
    pid_ = ::fork();
    if (pid_ == 0) {
      if (load == "heavy" && ::setpriority(PRIO_PROCESS, 0, -10) != 0) ::_exit(3);
      volatile uint64_t x = 0;
      for (;;) x = x + 1;
    }
    // Let it start (and, for heavy, see whether it could raise its priority).
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    int status = 0;
    if (pid_ > 0 && ::waitpid(pid_, &status, WNOHANG) == pid_) pid_ = -1;  // it exited: no right
  }
  ~Competitor() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  bool running() const { return pid_ > 0; }

 private:
  pid_t pid_ = 0;
};

}  // namespace

void section_load(BenchRunner& bench) {
  const BenchArgs& a = bench.args();
  std::vector<int> threads{1};
  if (num_threads() > 1) threads.push_back(num_threads());
  for (const char* load : {"idle", "busy", "heavy"}) {
    const Competitor competitor(load);
    if (std::string(load) != "idle" && !competitor.running()) {
      if (!a.json)
        fmt::print("  load {}: skipped (a process at nice -10 needs root or CAP_SYS_NICE)\n", load);
      continue;
    }
    bench.set_tag({{"load", load}});
    if (!a.json) fmt::print("  load {}:\n", load);
    for (int t : threads) {
      decode_step_row(bench, 1024, t);
      state_rw_row(bench, t);
      bench.favor_row(a.bh, 16, false, t);
      bench.favor_row(a.bh, 1024, false, t);
      bench.favor_row(a.bh, 1024, true, t);
    }
  }
  bench.set_tag(nullptr);
}

}  // namespace favor::cli
