// favor bench's estimators section: every --estimators kernel at each --estimator-lengths N,
// timed against FAVOR+ (positive) measured just before it in the same run.
#include <fmt/core.h>

#include "bench_runner.hpp"

namespace favor::cli {

// ratio_to_positive = seconds / seconds(positive). GFLOP/s counts the cost model's flops for
// the estimator's F (2m for trig and hyperbolic).
void section_estimators(BenchRunner& bench) {
  const BenchArgs& a = bench.args();
  for (int64_t n : a.estimator_lengths) {
    for (bool causal : {false, true}) {
      const double base = bench.favor_row(a.bh, n, causal, num_threads(), Kernel::positive,
                                          {{"ratio_to_positive", 1.0}});
      for (const std::string& name : a.estimators) {
        const Kernel kernel = parse_kernel(name, "--estimators");
        if (kernel == Kernel::positive) continue;
        const double seconds = bench.favor_row(a.bh, n, causal, num_threads(), kernel);
        bench.records().back()["ratio_to_positive"] = seconds / base;
        if (!a.json) fmt::print("{:>7} {} / positive = {:.2f}\n", "", name, seconds / base);
      }
    }
  }
}

}  // namespace favor::cli
