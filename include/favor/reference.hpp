#pragma once
/// \file reference.hpp
/// The scalar double-precision reference: naive, materialised, unstabilised formulas
/// exactly as math.md writes them. The oracle of every test; O(N^2) memory.
#include <optional>
#include <vector>

#include "favor/attention.hpp"
#include "favor/features.hpp"
#include "favor/projection.hpp"
#include "favor/tensor.hpp"
#include "favor/vq.hpp"

namespace favor::reference {

/// A double tensor [B, H, N, X], C-contiguous.
struct DTensor {
  Shape4 shape{0, 0, 0, 0};
  std::vector<double> values;
  double at(int64_t b, int64_t h, int64_t n, int64_t x) const {
    return values[static_cast<size_t>(((b * shape[1] + h) * shape[2] + n) * shape[3] + x)];
  }
};

/// phi(x) in double, all constants kept. [B, H, N, F].
DTensor features(TensorView x, const Projection& w, const FeatureOptions& options = {});

/// Materialised FAVOR attention in double: A = phi(Q) phi(K)^T with mask and causal
/// applied, y = A V / A 1. Rows with no visible key or a denominator <= 0 are zeros.
DTensor favor_attention(TensorView q, TensorView k, TensorView v, const Projection& w,
                        const AttentionOptions& options = {});

/// The same with any feature map (feature_map.hpp) and, causal, the decay gamma^(i-j).
DTensor features(TensorView x, const FeatureMap& map);
DTensor favor_attention(TensorView q, TensorView k, TensorView v, const FeatureMap& map,
                        const AttentionOptions& options = {});

/// Naive softmax attention in double (scores materialised per row, max-subtracted).
DTensor exact_attention(TensorView q, TensorView k, TensorView v, const ExactOptions& options = {});

/// Gradients of the materialised FAVOR formula in double (the formula of
/// favor_attention), for L = sum dy . y: dq, dk, dv and dW (m x d, row-major).
struct DGrads {
  DTensor dq, dk, dv;
  std::vector<double> dw;
  std::vector<double> dbias, dlambda, ddecay;  ///< as AttentionGrads (FeatureMap overload)
};
DGrads favor_attention_backward(TensorView q, TensorView k, TensorView v, TensorView dy,
                                const Projection& w, const AttentionOptions& options = {});

/// Gradients of the FeatureMap formula in double, with every parameter gradient the map and
/// options have (as favor_attention_backward with with_parameter_grads).
DGrads favor_attention_backward(TensorView q, TensorView k, TensorView v, TensorView dy,
                                const FeatureMap& map, const AttentionOptions& options = {});

/// Gradients of naive softmax attention in double.
DGrads exact_attention_backward(TensorView q, TensorView k, TensorView v, TensorView dy,
                                const ExactOptions& options = {});

/// Nearest code of every key in double (ties to the lowest index): [B*H*Nk], C order.
std::vector<int32_t> vq_assign(TensorView k, TensorView codebook);

/// VQ attention in double, materialised (math.md s.6). Hard VQ: naive softmax attention over
/// the quantised keys C_{z_j}, z from vq_assign above. Soft VQ: A_ij = sum_s exp(scale
/// q_i.C_s) p(s|k_j), y = A V / A 1. Mask and causal applied; rows with no visible key are
/// zeros.
DTensor vq_attention(TensorView q, TensorView k, TensorView v, TensorView codebook,
                     const VQOptions& options = {});

/// Gradients of reference::vq_attention in double for L = sum dy . y: dq, dv, dk
/// (straight-through for hard VQ, exact through p(s|k) for soft) and, in dw, dL/dC
/// ([Hc][c][D], C order).
DGrads vq_attention_backward(TensorView q, TensorView k, TensorView v, TensorView dy,
                             TensorView codebook, const VQOptions& options = {});

}  // namespace favor::reference
