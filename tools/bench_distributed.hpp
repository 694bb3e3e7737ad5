#pragma once
// The distributed section of `favor bench`: sequence-parallel attention over MPI ranks
// launched with mpirun, strong scaling (one sequence over 1, 2, 4 ranks) and weak scaling
// (the same tokens per rank), with each rank's time inside MPI, the time of the state
// collective alone and the bytes per rank. Defined by bench_distributed.cpp in a build with MPI,
// by no_distributed.cpp (an error, a no-op) in one without.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

namespace favor::cli {

struct DistributedBenchArgs {
  int64_t n = 262144;       ///< strong scaling: tokens of the one sequence
  int64_t weak_n = 262144;  ///< weak scaling: tokens per rank
  int64_t bh = 8, d = 64, m = 256;
  std::vector<int> ranks{1, 2, 4};
  int threads = 1;  ///< cores to share: each rank gets max(1, threads / P) favor threads
  int repeats = 3;  ///< timed calls per configuration after a warm-up (the median)
  bool json = false;
};

/// Runs every configuration as `mpirun -np P favor distributed-bench-rank ...` and returns the
/// records (section "distributed"); prints a table unless args.json. Throws favor::Error when
/// mpirun fails.
nlohmann::json distributed_section(const DistributedBenchArgs& args);

/// The hidden subcommand that each rank runs (MPI_Init, its slice, timed calls, rank 0 prints
/// one JSON line).
void add_distributed_bench_rank_command(CLI::App& app);

}  // namespace favor::cli
