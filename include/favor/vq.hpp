#pragma once
/// \file vq.hpp
/// Transformer-VQ attention (math.md s.6, docs/vq.md): keys quantised to a per-head codebook
/// make softmax attention linear exactly. Hard VQ gives softmax attention over the quantised
/// keys; soft VQ (temperature tau > 0) is the GMM form of seed 002.
///
/// Codebooks are float32 views of shape [1, Hc, c, D]: c codes of the head dim D, one set per
/// head (Hc = H) or one set shared by all heads (Hc = 1). They live in key space: keys are
/// assigned to codes by squared Euclidean distance, unscaled; the attention logits are
/// scale * q . C_s.
#include <cstdint>
#include <optional>
#include <vector>

#include "favor/tensor.hpp"

namespace favor {

struct VQOptions {
  /// Causal: query i sees keys j <= i. Requires Nq == Nk.
  bool causal = false;
  /// Temperature of the logits: softmax(scale * q . k^). Default 1/sqrt(D).
  std::optional<double> scale;
  /// Key padding mask [B, Nk]; masked keys leave numerator and denominator.
  std::optional<KeyMaskView> key_mask;
  /// 0: hard VQ (nearest code). > 0: soft VQ, key j belongs to code s with probability
  /// softmax_s(-|k_j - C_s|^2 / tau); tau -> 0 gives hard VQ. 0 < tau < 1e-30 is refused
  /// (hard VQ at float precision: pass 0).
  double tau = 0.0;
  /// Causal block length L >= 1: direct attention within a block, per-code sums of all
  /// earlier blocks. The result does not depend on L (to float rounding). 0: favor's default.
  int64_t block = 0;
};

struct VQStats {
  /// Query rows written as zeros: no key was visible (all masked, or causal prefix masked).
  int64_t zero_rows = 0;
};

/// y_i = sum_s exp(scale q_i.C_s) [Delta^T V]_s / sum_s exp(scale q_i.C_s) [Delta^T 1]_s per
/// (batch, head), stabilised. q: [B, H, Nq, D], k: [B, H, Nk, D], v: [B, H, Nk, Dv],
/// codebook: [1, H or 1, c, D], out: [B, H, Nq, Dv]. Time O(B H (Nq + Nk) c (D + Dv)),
/// memory O(threads c (D + Dv)) beyond the inputs. Throws favor::Error on a broken rule.
VQStats vq_attention(TensorView q, TensorView k, TensorView v, TensorView codebook,
                     MutableTensorView out, const VQOptions& options = {});
Tensor vq_attention(TensorView q, TensorView k, TensorView v, TensorView codebook,
                    const VQOptions& options = {}, VQStats* stats = nullptr);

/// Nearest code of every key (hard VQ): codes [B*H*N] (int32, C order over [B, H, N]) and,
/// when distances is not null, |k - C_z|^2 [B*H*N]. Ties go to the lowest index. The
/// distances to all codes come from one GEMM per tile (|C|^2 - 2 k.C).
void vq_assign(TensorView k, TensorView codebook, int32_t* codes, float* distances = nullptr);
std::vector<int32_t> vq_assign(TensorView k, TensorView codebook);

/// Gradients of vq_attention for L = sum dy . y. dq and dv are exact. Hard VQ: dk is the
/// straight-through estimate dL/dk^ (the gradient of the quantised key passed to the key);
/// soft VQ: dk is the exact gradient through p(s|k). dcodebook ([1, Hc, c, D], only when
/// asked) is the gradient through the logits q.C_s, the quantised keys (hard) or p(s|k)
/// (soft), for users who learn C by gradient instead of EMA. Causal: exact through the
/// whole prefix (a reverse scan over blocks, not truncated). Linear time and memory.
struct VQGrads {
  Tensor dq, dk, dv;
  Tensor dcodebook;  ///< empty unless requested
};
VQGrads vq_attention_backward(TensorView q, TensorView k, TensorView v, TensorView dy,
                              TensorView codebook, const VQOptions& options = {},
                              bool with_codebook_grad = false);

}  // namespace favor
