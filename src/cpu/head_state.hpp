#pragma once
// Per-(batch, head) pieces shared by the FAVOR kernels and the decoder: the linear state
// and the final division y / den into the caller's output.
//
// The state is one F x (dv + 1) matrix Sx = [S | s] = phi(K)^T [V | 1]: the normaliser
// rides along as the last column, so one GEMM with [V | 1] updates both, and one GEMM with
// Sx yields numerator and denominator of every query row together.
#include <cstdint>
#include <limits>

namespace favor::cpu {

/// Sx = [S | s] relative to exp(max): the true sums are exp(max) * Sx. Row-major, ld dv + 1.
struct HeadState {
  float* Sx;
  int64_t features, dv;
  double max = -std::numeric_limits<double>::infinity();

  int64_t ld() const { return dv + 1; }
  void clear();
  /// Raises the reference max to new_max (> max), rescaling Sx by exp(max - new_max).
  void raise_max(double new_max);
  /// Sx += phi^T vx for `rows` feature rows phi (rows x F) and augmented values vx
  /// (rows x (dv + 1), last column 1).
  void accumulate(const float* phi, const float* vx, int64_t rows);
  /// this = this + other (both rescaled to the larger max).
  void add(const HeadState& other);
  /// this = other (same sizes).
  void copy_from(const HeadState& other);
  /// s (the last column) into out[F].
  void copy_normaliser(float* out) const;
};

/// Gathers `rows` value rows (row stride stride_n, element stride stride_d) into vx
/// (rows x (dv + 1)) with a last column of ones.
void gather_values(const float* base, int64_t stride_n, int64_t stride_d, int64_t rows, int64_t dv,
                   float* vx);

/// Writes `rows` rows of dv zeros through (stride_n, stride_d): the output of query rows that
/// see no key.
void write_zero_rows(float* out, int64_t rows, int64_t dv, int64_t stride_n, int64_t stride_d);

/// out[r] = yx[r, :dv] / yx[r, dv] for `rows` rows of yx (ld dv + 1), written through
/// (stride_n, stride_d). A row whose denominator is not > 0 or whose quotient is not finite
/// is written as zeros; returns how many such rows there were.
int64_t write_rows(const float* yx, int64_t rows, int64_t dv, float* out, int64_t stride_n,
                   int64_t stride_d);

}  // namespace favor::cpu
