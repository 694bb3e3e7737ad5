// favor bench's forward sections: sweep (favor and exact over N, both modes), long (one
// head at the longest N) and scaling (the same problems on one thread and on all).
#include <algorithm>

#include "bench_runner.hpp"

namespace favor::cli {

void section_sweep(BenchRunner& bench) {
  const BenchArgs& a = bench.args();
  for (int64_t n : a.lengths) {
    for (bool causal : {false, true}) {
      bench.favor_row(a.bh, n, causal, num_threads());
      if (n <= a.max_exact_n) bench.exact_row(a.bh, n, causal);
    }
  }
}

void section_long(BenchRunner& bench) {
  const BenchArgs& a = bench.args();
  const int64_t longest = *std::max_element(a.lengths.begin(), a.lengths.end());
  for (bool causal : {false, true}) bench.favor_row(1, longest, causal, num_threads());
}

void section_scaling(BenchRunner& bench) {
  const BenchArgs& a = bench.args();
  if (num_threads() <= 1) return;
  for (int64_t bh : {a.bh, int64_t{1}}) {
    for (bool causal : {false, true}) {
      bench.favor_row(bh, a.scaling_n, causal, 1);
      bench.favor_row(bh, a.scaling_n, causal, num_threads());
    }
  }
}

}  // namespace favor::cli
