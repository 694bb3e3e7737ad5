#pragma once
// The backward pass through the feature maps. Given stabilised features phi and the
// gradient dphi with respect to them, only the products dphi * phi enter (the shifts
// cancel: docs/gradients.md), so:
//   positive    d/da_f = dphi_f phi_f
//   hyperbolic  d/da_f = dphi+_f phi+_f - dphi-_f phi-_f
//   trig        d/da_f = dphi_sin,f phi_cos,f - dphi_cos,f phi_sin,f
// with a = W x; keys also carry their norm factor exp(-+|x|^2/2), whose gradient is
// -+x sum_f dphi_f phi_f (queries' factor cancels in the output and is not formed).
#include <cstdint>

#include "cpu/feature_params.hpp"
#include "favor/features.hpp"

namespace favor::cpu {

/// Head bh of `map`: dx (rows x d) = sqrt_scale * (Pa W + norm term) for scaled input rows x (rows x d);
/// dw (m x d) += Pa^T x when dw is non-null; db (m) += the column sums of Pa when db is
/// non-null (FAVOR++ / FAVOR#: the gradient of the log bias, added to a). pa: rows x m scratch.
void feature_backward(const FeatureParams& map, int64_t bh, bool key, int64_t rows, const float* x,
                      const float* phi, const float* dphi, float* pa, float* dx, float* dw,
                      float* db);

/// The upstream gradient in augmented form: for rows of [num | den] (ld dv + 1) and dy,
/// gx = [dy / den, -(dy . y) / den], or zeros for rows the forward defined as zeros
/// (den not > 0, or a non-finite quotient).
void upstream_rows(const float* yx, const float* dy, int64_t dy_stride_n, int64_t dy_stride_d,
                   int64_t rows, int64_t dv, float* gx);

}  // namespace favor::cpu
