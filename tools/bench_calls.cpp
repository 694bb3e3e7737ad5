// favor bench's calls section: the time of one forward call at short N (--call-lengths,
// B*H = --bh), favor and favor's exact attention, bidirectional and causal, and the per-call
// overhead: the intercept t0 of the least-squares line t(N) = t0 + t1 N over N <= 64 (what a
// call costs beyond its work; docs/performance.md, "Per-call overhead").
#include <fmt/format.h>

#include <vector>

#include "bench_runner.hpp"

namespace favor::cli {
namespace {

struct Line {
  double intercept, slope;
};

// Least squares t = t0 + t1 n over the points with n <= 64 (all points when fewer than two).
Line fit_line(const std::vector<std::pair<int64_t, double>>& points) {
  std::vector<std::pair<int64_t, double>> use;
  for (const auto& p : points)
    if (p.first <= 64) use.push_back(p);
  if (use.size() < 2) use = points;
  double sn = 0, st = 0, snn = 0, snt = 0;
  for (const auto& [n, t] : use) {
    sn += double(n), st += t, snn += double(n) * double(n), snt += double(n) * t;
  }
  const double k = double(use.size()), det = k * snn - sn * sn;
  if (use.size() < 2 || det == 0.0) return {use.empty() ? 0.0 : use.front().second, 0.0};
  const double slope = (k * snt - sn * st) / det;
  return {(st - slope * sn) / k, slope};
}

}  // namespace

void section_calls(BenchRunner& bench) {
  const BenchArgs& a = bench.args();
  if (a.call_lengths.empty()) return;
  for (const char* method : {"favor", "exact"}) {
    for (bool causal : {false, true}) {
      std::vector<std::pair<int64_t, double>> points;
      const size_t first = bench.records().size();
      for (int64_t n : a.call_lengths) {
        const double s = std::string(method) == "favor"
                             ? bench.favor_row(a.bh, n, causal, num_threads())
                             : bench.exact_row(a.bh, n, causal);
        points.emplace_back(n, s);
      }
      const Line line = fit_line(points);
      for (size_t i = first; i < bench.records().size(); ++i) {
        bench.records()[i]["call_overhead_us"] = line.intercept * 1e6;
        bench.records()[i]["call_us_per_token"] = line.slope * 1e6;
      }
      if (!a.json) {
        fmt::print("  {} {}: per-call overhead (t(N) = t0 + t1 N, N <= 64) t0 = {:.1f} us, "
                   "t1 = {:.2f} us per token of B*H = {}; N = {}: {:.1f} us\n",
                   method, causal ? "causal" : "bidirectional", line.intercept * 1e6,
                   line.slope * 1e6, a.bh, points.front().first, points.front().second * 1e6);
      }
    }
  }
}

}  // namespace favor::cli
