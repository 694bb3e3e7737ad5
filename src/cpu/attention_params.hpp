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
  const float* w;  // m x d, row-major
  int64_t m;
  Kernel kernel;
  float sqrt_scale;     // inputs are multiplied by sqrt(scale) before the feature map
  const uint8_t* mask;  // [B, Nk], nonzero = key takes part; null = no mask
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
  float* dw;                          // m x d, accumulated; null when not requested
  const float* ctx_states = nullptr;  // bidirectional: the forward's saved [S | s] per head
  const double* ctx_maxima = nullptr;
};

/// Bidirectional FAVOR attention; returns the number of rows written as zeros.
int64_t favor_bidirectional(const AttentionParams& p);
/// Causal FAVOR attention (chunked); returns the number of rows written as zeros.
int64_t favor_causal(const AttentionParams& p);
/// Gradients of bidirectional and causal FAVOR attention.
void favor_backward_bidirectional(const BackwardParams& p);
void favor_backward_causal(const BackwardParams& p);

}  // namespace favor::cpu
