// The CLI's distributed commands in a favor built without MPI: each says so and how to get
// them. The MPI build compiles attention_distributed.cpp and bench_distributed.cpp instead
// (tools/CMakeLists.txt), so no other file of the CLI depends on whether MPI was found.
#include "attention_args.hpp"
#include "bench_distributed.hpp"
#include "commands.hpp"

namespace favor::cli {

void run_distributed_attention(const AttentionArgs&) {
  throw Error(
      "--distributed: this favor was built without MPI; install MPI (Debian: libopenmpi-dev "
      "openmpi-bin), rebuild, and launch with mpirun -np P favor attention --distributed");
}

nlohmann::json distributed_section(const DistributedBenchArgs&) {
  throw Error(
      "--sections distributed: this favor was built without MPI (install "
      "libopenmpi-dev and rebuild)");
}

void add_distributed_bench_rank_command(CLI::App&) {}  // no hidden rank command to add

}  // namespace favor::cli
