#pragma once
// Per-(batch, head) pieces shared by the FAVOR kernels and the decoder: the linear state
// (S, s, running key max) and the final division y / den into the caller's output.
#include <cstdint>
#include <limits>

namespace favor::cpu {

/// S (F x dv), s (F), both relative to exp(max): the true sums are exp(max) * S, exp(max) * s.
struct HeadState {
  float* S;
  float* s;
  int64_t features, dv;
  double max = -std::numeric_limits<double>::infinity();

  void clear();
  /// Raises the reference max to new_max (> max), rescaling S and s by exp(max - new_max).
  void raise_max(double new_max);
  /// S += phi^T v, s += phi^T 1 for `rows` feature rows phi (rows x F) and values v (rows x dv).
  void accumulate(const float* phi, const float* v, int64_t rows, const float* ones);
  /// this = this + other (both rescaled to the larger max).
  void add(const HeadState& other);
  /// this = other (same sizes).
  void copy_from(const HeadState& other);
};

/// out[r] = y[r] / den[r] for `rows` rows written through (stride_n, stride_d). A row whose
/// denominator is not > 0 or whose quotient is not finite is written as zeros; returns
/// how many such rows there were.
int64_t write_rows(const float* y, const float* den, int64_t rows, int64_t dv, float* out,
                   int64_t stride_n, int64_t stride_d);

}  // namespace favor::cpu
