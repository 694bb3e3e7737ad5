#pragma once
// The kernel contract of Transformer-VQ, free of CPU policy: the attention params (q, k, v, out,
// sizes, mask) plus the codebook, and the key assignment. The facades (src/vq_attention.cpp,
// src/vq_backward.cpp) validate and fill them; kernels never throw.
#include <cstdint>

#include "kernels/attention_params.hpp"

namespace favor::kernels {

struct VQParams {
  AttentionParams base;   // w, m, kernel, sqrt_scale unused
  const float* codebook;  // [Hc][c][d], C-contiguous (the facade copies a strided view)
  int64_t codes;
  int64_t codebook_head_stride;  // c * d, or 0 when one codebook is shared by all heads
  float scale;                   // logits are scale * q . C_s
  float tau;                     // 0: hard VQ
  int64_t block;                 // causal block length L >= 1
  // Sequence-parallel attention (favor/sequence_parallel.hpp): per head the per-code sums
  // [Vsum | n] (B*H x c x (dv + 1)): bidirectional, of every rank's keys (the key pass is
  // skipped); causal, of the keys before key 0 (the earlier ranks' keys). Plain sums of key
  // weights in [0, 1]: no stabiliser.
  const float* init_states = nullptr;
  // Causal: if set, each head's [Vsum | n] after its last key (B*H x c x (dv + 1)), read by
  // VQDecoder::prefill; may be init_states (a head reads its initial state first).
  float* final_states = nullptr;

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
  // Sequence-parallel backward (favor/sequence_parallel.hpp); fwd.init_states gives the key
  // sums as in the forward pass. With code_sums_out, every code takes the moment route (hard
  // VQ) and each head's query-side sums of this call's queries are written there
  // (vq_code_sums_size floats, [U | r | T | w], cpu/vq_grad_tile.hpp save_code_sums).
  // Bidirectional, only the query pass runs (dq, the logit part of dC): the keys wait for
  // vq_backward_keys with the sums of every rank. Causal, both sweeps run (the reverse one
  // over this call's queries only); the later ranks' part follows by vq_backward_keys.
  float* code_sums_out = nullptr;
};

/// The nearest code of every key (favor::vq_assign; hard VQ, ties to the lowest index).
struct VQAssignParams {
  VQParams keys;     // base: batch, heads, d, k, nk; codebook, codes, codebook_head_stride
  int32_t* codes;    // [B*H*N]
  float* distances;  // [B*H*N]: |k - C_z|^2; null if not asked
};

}  // namespace favor::kernels
