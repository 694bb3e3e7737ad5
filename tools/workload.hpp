#pragma once
// Synthetic inputs shared by `favor demo` and `favor bench`.
#include <cstdint>

#include "favor/favor.hpp"

namespace favor::cli {

/// Gaussian rows from the library's deterministic normal stream (an iid projection draw),
/// each rescaled to Euclidean norm `norm` when norm > 0.
Tensor gaussian_rows(const Shape4& shape, uint64_t seed, double norm = 0.0);

}  // namespace favor::cli

#include <algorithm>
#include <chrono>
#include <vector>

namespace favor::cli {

/// Median wall time of at least `repeats` runs after one warm-up run; short runs are
/// repeated until `min_total_s` of measurements are in (at most 200 runs), which steadies
/// them on a shared machine. A warm-up that takes longer than `single_run_s` is itself the
/// measurement (long runs are not repeated).
template <class F>
double median_seconds(F&& f, int repeats, double single_run_s = 1.0, double min_total_s = 0.3) {
  const auto time_once = [&f] {
    const auto start = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const double first = time_once();
  if (first > single_run_s) return first;
  std::vector<double> t;
  double total = 0.0;
  while (static_cast<int>(t.size()) < repeats || (total < min_total_s && t.size() < 200)) {
    t.push_back(time_once());
    total += t.back();
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace favor::cli
