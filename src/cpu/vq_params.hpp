#pragma once
// The params structs of the Transformer-VQ kernels: the attention params (q, k, v, out,
// sizes, mask, threads) plus the codebook. The facades (src/vq_attention.cpp,
// src/vq_backward.cpp) validate and fill them; kernels never throw.
#include <cstdint>

#include "cpu/attention_params.hpp"

namespace favor::cpu {

struct VQParams {
  AttentionParams base;   // w, m, kernel, sqrt_scale unused
  const float* codebook;  // [Hc][c][d], C-contiguous (the facade copies a strided view)
  int64_t codes;
  int64_t codebook_head_stride;  // c * d, or 0 when one codebook is shared by all heads
  float scale;                   // logits are scale * q . C_s
  float tau;                     // 0: hard VQ
  int64_t block;                 // causal block length L >= 1

  const float* head_codebook(int64_t bh) const {
    return codebook + (bh % base.heads) * codebook_head_stride;
  }
};

/// The backward pass: the forward's params plus dy and the gradient outputs, C-contiguous
/// [B, H, N, X] and zero-initialised by the caller.
struct VQBackwardParams {
  VQParams fwd;
  const float* dy;
  Shape4 dy_strides;
  float* dq;
  float* dk;
  float* dv;
  float* dcodebook;  // [Hc][c][d], accumulated (summed over batch, and over heads if shared); null
                     // if not asked
};

/// Bidirectional and causal VQ attention; return the number of rows written as zeros.
int64_t vq_bidirectional(const VQParams& p);
int64_t vq_causal(const VQParams& p);
/// Gradients of bidirectional and causal VQ attention.
void vq_backward_bidirectional(const VQBackwardParams& p);
void vq_backward_causal(const VQBackwardParams& p);

}  // namespace favor::cpu
