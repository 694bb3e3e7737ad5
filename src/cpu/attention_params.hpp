#pragma once
// The one plain struct the attention kernels take: raw pointers, element strides per
// axis, sizes and precomputed scalars. The facade (src/attention.cpp) validates and fills
// it; kernels never throw.
#include <cstdint>

#include "cpu/feature_params.hpp"
#include "cpu/tiles.hpp"
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
  FeatureParams map;           // the feature map (cpu/feature_params.hpp)
  int64_t first_position = 0;  // position of key 0 (decay): the decoder's tokens so far
  int64_t chunk = kChunk;  // causal forward: chunk length C, 1 .. kChunk (the tests vary it)
  const uint8_t* mask;         // [B, Nk], nonzero = key takes part; null = no mask
  int64_t mask_stride_b, mask_stride_n;
  int threads;
  float* ctx_states = nullptr;   // bidirectional: save [S | s] per head here (B*H x F x (dv + 1))
  double* ctx_maxima = nullptr;  // ... and its max per head
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
  // dL/d(log lambda^2) of the feature weights and dL/d(rate) of the decay (rate = -log gamma),
  // one slice per (batch, head): [B*H][m] and [B*H]; null when not requested. The facade
  // sums them into the map's parameter sets.
  float* dlogw = nullptr;
  double* drate = nullptr;
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
