#pragma once
// Slices of a sequence for the sequence-parallel tests (thread ranks and MPI ranks): rows of a
// tensor along N, slice bounds from weights, and the comparison of a slice with the rows of
// the whole sequence's result.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "favor/tensor.hpp"

namespace favor::testing {

/// Rows [begin, end) along N.
inline Tensor rows_of(const Tensor& t, int64_t begin, int64_t end) {
  const Shape4 s = t.shape();
  Tensor out({s[0], s[1], end - begin, s[3]});
  for (int64_t b = 0; b < s[0]; ++b)
    for (int64_t h = 0; h < s[1]; ++h)
      for (int64_t n = begin; n < end; ++n)
        for (int64_t x = 0; x < s[3]; ++x) out.at(b, h, n - begin, x) = t.at(b, h, n, x);
  return out;
}

/// Largest |part - whole| over the rows [begin, begin + part's N) of `whole`.
inline double max_diff(const Tensor& part, const Tensor& whole, int64_t begin) {
  double worst = 0.0;
  const Shape4 s = part.shape();
  for (int64_t b = 0; b < s[0]; ++b)
    for (int64_t h = 0; h < s[1]; ++h)
      for (int64_t n = 0; n < s[2]; ++n)
        for (int64_t x = 0; x < s[3]; ++x)
          worst =
              std::max(worst, std::abs(double(part.at(b, h, n, x)) - whole.at(b, h, begin + n, x)));
  return worst;
}

inline double max_abs(const std::vector<float>& v) {
  double m = 0.0;
  for (float x : v) m = std::max(m, std::abs(double(x)));
  return m;
}

/// Slice bounds of n positions over P ranks from relative weights (a weight 0: an empty
/// slice): P + 1 bounds.
inline std::vector<int64_t> bounds_of(int64_t n, const std::vector<int>& weights) {
  int total = 0;
  for (int w : weights) total += w;
  std::vector<int64_t> b{0};
  int acc = 0;
  for (int w : weights) {
    acc += w;
    b.push_back(n * acc / total);
  }
  return b;
}

}  // namespace favor::testing
