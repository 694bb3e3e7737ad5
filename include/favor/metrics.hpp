#pragma once
/// \file metrics.hpp
/// Error metrics for comparing approximate and exact attention.
#include "favor/features.hpp"
#include "favor/projection.hpp"
#include "favor/tensor.hpp"

namespace favor {

/// |approx - exact|_F / |exact|_F over the whole tensor, accumulated in double.
/// Shapes must match; |exact|_F must be > 0.
double relative_frobenius_error(TensorView approx, TensorView exact);

/// Mean over all pairs (i, j) of (phi(x_i).phi(y_j) - exp(scale x_i.y_j))^2, in double,
/// for x: [Nx, D], y: [Ny, D] given as [1, 1, N, D] views. O(Nx Ny F): small problems only.
double kernel_mse(TensorView x, TensorView y, const Projection& w,
                  const FeatureOptions& options = {});

}  // namespace favor
