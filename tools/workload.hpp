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

/// Median wall time of `repeats` runs after one warm-up run. A warm-up that takes longer
/// than `single_run_s` is itself the measurement (long runs are not repeated).
template <class F>
double median_seconds(F&& f, int repeats, double single_run_s = 1.0) {
  const auto time_once = [&f] {
    const auto start = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const double first = time_once();
  if (first > single_run_s) return first;
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) t.push_back(time_once());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace favor::cli
