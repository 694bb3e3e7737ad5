// favor bench's backward section: at each --backward-lengths N and both modes, the FAVOR
// forward, its backward (and, bidirectional, the saved-context pattern) and, up to
// --max-exact-backward-n, exact attention's forward and backward.
#include "bench_runner.hpp"

namespace favor::cli {

void section_backward(BenchRunner& bench) {
  const BenchArgs& a = bench.args();
  for (int64_t n : a.backward_lengths) {
    for (bool causal : {false, true}) {
      const double forward = bench.favor_row(a.bh, n, causal, num_threads());
      bench.favor_backward_row(a.bh, n, causal, forward);
      if (n <= a.max_exact_backward_n)
        bench.exact_backward_row(a.bh, n, causal, bench.exact_row(a.bh, n, causal));
    }
  }
}

}  // namespace favor::cli
