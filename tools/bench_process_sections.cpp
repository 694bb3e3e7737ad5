// favor bench's sections timed in other processes: io (`favor attention` as a whole process,
// tools/bench_io.cpp) and distributed (sequence-parallel attention over mpirun's ranks,
// tools/bench_distributed.cpp), given favor bench's sizes, threads and repeats.
#include <algorithm>

#include "bench_distributed.hpp"
#include "bench_io.hpp"
#include "bench_runner.hpp"

namespace favor::cli {

// `favor attention` as a whole process vs the same call here.
void section_io(BenchRunner& bench) {
  const BenchArgs& a = bench.args();
  IoBenchArgs o;
  o.n = a.io_n;
  o.bh = a.bh;
  o.d = a.d;
  o.m = a.m;
  o.threads = num_threads();
  o.repeats = std::max(3, a.repeats);
  o.json = a.json;
  for (auto& r : io_section(o)) bench.records().push_back(std::move(r));
}

// Sequence-parallel attention over 1, 2, 4 MPI ranks (an error in a build without MPI:
// tools/no_distributed.cpp).
void section_distributed(BenchRunner& bench) {
  const BenchArgs& a = bench.args();
  DistributedBenchArgs d;
  d.n = a.distributed_n;
  d.weak_n = a.distributed_weak_n;
  d.ranks = a.distributed_ranks;
  d.bh = a.bh;
  d.d = a.d;
  d.m = a.m;
  d.threads = num_threads();
  d.repeats = std::max(1, std::min(a.repeats, 3));  // the calls take seconds: at most 3
  d.json = a.json;
  for (auto& r : distributed_section(d)) bench.records().push_back(std::move(r));
}

}  // namespace favor::cli
