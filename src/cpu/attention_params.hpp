#pragma once
// The one plain struct the attention kernels take: raw pointers, element strides per
// axis, sizes and precomputed scalars. The facade (src/attention.cpp) validates and fills
// it; kernels never throw.
#include <cstdint>

#include "favor/features.hpp"
#include "favor/tensor.hpp"

namespace favor::cpu {

struct AttentionParams {
  const float* q;
  Shape4 q_strides;
  const float* k;
  Shape4 k_strides;
  const float* v;
  Shape4 v_strides;
  float* out;
  Shape4 out_strides;
  int64_t batch, heads, nq, nk, d, dv;
  const float* w;  // m x d, row-major; one per (batch, head) when w_head_stride != 0
  int64_t m;
  int64_t w_head_stride = 0;     // floats between the W of consecutive (batch, head); 0 = shared
  const float* bias = nullptr;   // FAVOR++ / FAVOR#: log bias per feature, [B*H or 1][m]
  int64_t bias_head_stride = 0;  // floats between consecutive heads' biases; 0 = shared
  Kernel kernel;
  float sqrt_scale;     // inputs are multiplied by sqrt(scale) before the feature map
  const uint8_t* mask;  // [B, Nk], nonzero = key takes part; null = no mask
  int64_t mask_stride_b, mask_stride_n;
  int threads;
  float* ctx_states = nullptr;   // bidirectional: save [S | s] per head here (B*H x F x (dv + 1))
  double* ctx_maxima = nullptr;  // ... and its max per head

  const float* head_w(int64_t bh) const { return w + bh * w_head_stride; }
  const float* head_bias(int64_t bh) const { return bias ? bias + bh * bias_head_stride : nullptr; }
};

/// The backward pass: the forward's params plus dy and the gradient outputs, which are
/// C-contiguous [B, H, N, X] and zero-initialised by the caller.
struct BackwardParams {
  AttentionParams fwd;
  const float* dy;
  Shape4 dy_strides;
  float* dq;
  float* dk;
  float* dv;
  // dL/dW (m x d), accumulated; null when not requested. FAVOR++ / FAVOR#: dL/dW_h of the
  // per-head projection (fwd.w) and dL/db_h of the log bias (fwd.bias), one per (batch, head)
  // (strides m d and m) or one sum over heads (strides 0).
  float* dw;
  int64_t dw_head_stride = 0;
  float* dbias = nullptr;
  int64_t dbias_head_stride = 0;
  const float* ctx_states = nullptr;  // bidirectional: the forward's saved [S | s] per head
  const double* ctx_maxima = nullptr;

  /// Whether dW (dbias) is one sum over heads, which the threads accumulate in partials.
  bool summed_dw() const { return dw && dw_head_stride == 0; }
  bool summed_dbias() const { return dbias && dbias_head_stride == 0; }
  /// Where head bh accumulates dW (dbias): its own slice of an output with one per head, else
  /// `partial`, the running thread's share of the sum (null when not requested).
  float* head_dw(int64_t bh, float* partial) const {
    return dw_head_stride ? dw + bh * dw_head_stride : partial;
  }
  float* head_dbias(int64_t bh, float* partial) const {
    return dbias_head_stride ? dbias + bh * dbias_head_stride : partial;
  }
};

/// Bidirectional FAVOR attention; returns the number of rows written as zeros.
int64_t favor_bidirectional(const AttentionParams& p);
/// Causal FAVOR attention (chunked); returns the number of rows written as zeros.
int64_t favor_causal(const AttentionParams& p);
/// Gradients of bidirectional and causal FAVOR attention.
void favor_backward_bidirectional(const BackwardParams& p);
void favor_backward_causal(const BackwardParams& p);

}  // namespace favor::cpu
