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
  int64_t chunk = kChunk;      // causal forward: chunk length C, 1 .. kChunk (the tests vary it)
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
  // dL/dW_h of head bh's projection (map.head_w(bh)) and dL/db_h of its bias, one slice per
  // (batch, head): [B*H][m][d] and [B*H][m], accumulated; null when not requested. The facade
  // sums the slices into the parameter sets in head order (core/parameter_grads.hpp), so the
  // result does not depend on which thread ran which head.
  float* dw = nullptr;
  float* dbias = nullptr;
  // dL/d(log lambda^2) of the feature weights and dL/d(rate) of the decay (rate = -log gamma),
  // one slice per (batch, head): [B*H][m] and [B*H]; null when not requested. The facade
  // sums them into the map's parameter sets.
  float* dlogw = nullptr;
  double* drate = nullptr;
  const float* ctx_states = nullptr;  // bidirectional: the forward's saved [S | s] per head
  const double* ctx_maxima = nullptr;

  /// Head bh's slices of dW and dbias (null when not requested).
  float* head_dw(int64_t bh) const { return dw ? dw + bh * fwd.map.m * fwd.map.d : nullptr; }
  float* head_dbias(int64_t bh) const { return dbias ? dbias + bh * fwd.map.m : nullptr; }
};

/// Bidirectional FAVOR attention; returns the number of rows written as zeros.
int64_t favor_bidirectional(const AttentionParams& p);
/// Causal FAVOR attention (chunked); returns the number of rows written as zeros.
int64_t favor_causal(const AttentionParams& p);
/// Gradients of bidirectional and causal FAVOR attention.
void favor_backward_bidirectional(const BackwardParams& p);
void favor_backward_causal(const BackwardParams& p);

}  // namespace favor::cpu
