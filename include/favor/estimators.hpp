#pragma once
/// \file estimators.hpp
/// Data-adapted positive features: FAVOR++ (optimal positive random features, OPRF) and
/// FAVOR# (SDERF, dense-exponential random features). Both are unbiased for any
/// parameter below 1/8; the parameters below are the variance-optimal ones for given data.
/// See docs/estimators.md and math.md s.2.
#include <cstdint>
#include <optional>
#include <vector>

#include "favor/tensor.hpp"

namespace favor {

enum class Kernel;

/// The parameters of a data-adapted kernel, per (batch, head) or shared by every head.
/// Head (b, h) uses entry b * H + h, or entry 0 when heads == 1.
/// FAVOR++: phi(x) = m^-1/2 (1-4A)^(d/4) exp(A |w|^2 + sqrt(1-4A) w.x - |x|^2/2).
/// FAVOR#:  phi(x) = m^-1/2 prod_l (1-4A_l)^(1/4) exp(sum_l A_l w_l^2 + w.(B x) - |x|^2/2),
///          B = diag(sqrt(1 - 4 A_l)) Q^T, Q = [basis columns].
/// FAVOR++ is FAVOR# with Q = I and all A_l equal; both are stored the same way.
struct KernelFit {
  int64_t heads = 0;
  int64_t d = 0;
  std::vector<double> a;      ///< heads x d: A_l per direction (FAVOR++: d equal values)
  std::vector<double> basis;  ///< heads x d x d, row-major, column l = direction of A_l

  /// One A for every head and direction (FAVOR++ with a fixed or calibrated A).
  static KernelFit constant(double a, int64_t d);
  bool empty() const { return heads == 0; }
};

/// The variance-optimal FAVOR++ parameter for rho = mean |x + y|^2 / d:
/// A* = (1 - 2 rho - sqrt((2 rho + 1)^2 + 8 rho)) / 16  (<= 0 for rho >= 0).
double optimal_a(double rho);

/// Fits FAVOR++ (kernel == favorpp) or FAVOR# (favorsharp) to queries and keys
/// (x = q sqrt(scale), y = k sqrt(scale); masked keys are left out), one entry per
/// (batch, head), in time O(B H N D^2) (FAVOR#) or O(B H N D) (FAVOR++).
/// Bidirectional attention fits itself when AttentionOptions::fit is empty; causal and
/// streaming attention must be given a fit (from calibration data, or
/// KernelFit::constant), because a fit on the sequence would let every position see
/// statistics of future tokens.
KernelFit fit_kernel(Kernel kernel, TensorView q, TensorView k, std::optional<double> scale = {},
                     std::optional<KeyMaskView> key_mask = {});

/// The sums a FAVOR++ / FAVOR# fit is computed from, per (batch, head): for q and then k
/// (scaled, masked keys left out) the row count, the sum of the rows (d) and the sum of
/// their outer products (d x d, FAVOR#) or of their squared norms (1, FAVOR++). Moments of
/// slices of a sequence add up, element by element, to the moments of the whole sequence, so
/// ranks that hold slices fit the same kernel (sequence_parallel.hpp).
struct KernelMoments {
  Kernel kernel{};
  int64_t heads = 0;  ///< B*H
  int64_t d = 0;
  std::vector<double> sums;  ///< heads x record(): [nq, sum_q, second_q, nk, sum_k, second_k]
  /// Doubles per head.
  int64_t record() const;
  /// Zero moments (an empty slice).
  static KernelMoments zeros(Kernel kernel, int64_t heads, int64_t d);
};

/// The moments of q [B, H, Nq, D] and k [B, H, Nk, D] (either may have N = 0: no rows).
KernelMoments kernel_moments(Kernel kernel, TensorView q, TensorView k,
                             std::optional<double> scale = {},
                             std::optional<KeyMaskView> key_mask = {});
/// The fit from moments: fit_kernel(kernel, q, k, ...) is fit_from_moments(kernel_moments(...)).
/// A head with no rows at all fits as if its mean and second moment were zero.
KernelFit fit_from_moments(const KernelMoments& moments);

/// Closed-form MSE of the estimate phi(x).phi(y) of exp(x.y) with m iid projections
/// (math.md s.4), for rows x, y of length d already multiplied by sqrt(scale): positive,
/// trig, hyperbolic (m projections, 2m features), and FAVOR++ / FAVOR# with head `head` of
/// `fit` (required for those two). The MSE is Var_1 / m, Var_1 the variance of one term.
double iid_mse(Kernel kernel, const double* x, const double* y, int64_t d, int64_t m,
               const KernelFit* fit = nullptr, int64_t head = 0);

}  // namespace favor
