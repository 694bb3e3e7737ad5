#pragma once
// The backward pass through the feature maps. Given stabilised features phi and the
// gradient dphi with respect to them, only the products dphi * phi enter (the shifts
// cancel: docs/gradients.md), so:
//   positive              d/da_f = dphi_f phi_f
//   hyperbolic, hedgehog  d/da_f = dphi+_f phi+_f - dphi-_f phi-_f
//   trig                  d/da_f = dphi_sin,f phi_cos,f - dphi_cos,f phi_sin,f
// with a = W x + b; keys also carry their norm factor exp(-+|x|^2/2) (none for hedgehog),
// whose gradient is -+x sum_f dphi_f phi_f (queries' factor cancels in the output and is not
// formed), and their feature weights' log weights (KeyRows).
#include <cstdint>

#include "cpu/contract.hpp"
#include "favor/features.hpp"

namespace favor::cpu {

/// What key rows add beyond dx: the gradient of the feature weights' key-only log weights.
/// A key's features carry exp(l_f) (l_f = log lambda_f^2), so
///   dlogw[f] += sum_r sum over the features of row f of dphi phi
/// (the products are the unstabilised ones: the shifts cancel). The decay's key log weight
/// (+ position * rate) is not differentiated here: sum_r position_r dL/dg_r cancels badly
/// (sum_r dL/dg_r = 0), so the causal backward forms dL/drate in pair form from the attention
/// weights instead (favor_backward_causal.cpp).
struct KeyRows {
  float* dlogw = nullptr;  // m, or null
};

/// Head bh of `map`: dx (rows x d) = sqrt_scale * (Pa W + norm term) for scaled input rows x
/// (rows x d); dw (m x d) += Pa^T x when dw is non-null; db (m) += the column sums of Pa when db
/// is non-null (the gradient of the bias added to a: FAVOR++ / FAVOR# log bias, learned b).
/// `key` is null for query rows; for key rows it adds the norm term and the KeyRows gradients.
/// pa: rows x m scratch.
void feature_backward(const FeatureParams& map, int64_t bh, const KeyRows* key, int64_t rows,
                      const float* x, const float* phi, const float* dphi, float* pa, float* dx,
                      float* dw, float* db);

/// The upstream gradient in augmented form: for rows of [num | den] (ld dv + 1) and dy,
/// gx = [dy / den, -(dy . y) / den], or zeros for rows the forward defined as zeros
/// (den not > 0, or a non-finite quotient).
void upstream_rows(const float* yx, const float* dy, int64_t dy_stride_n, int64_t dy_stride_d,
                   int64_t rows, int64_t dv, float* gx);

}  // namespace favor::cpu
