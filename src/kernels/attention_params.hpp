#pragma once
// The kernel contract, free of CPU policy: the plain structs the attention kernels take (raw
// host pointers, element strides per axis, sizes and precomputed scalars). The
// facades validate and fill them; kernels never throw. How a backend runs them (threads,
// chunk length on the CPU: cpu/config.hpp) is the backend's configuration, not part of the
// contract.
#include <cstdint>

#include "favor/tensor.hpp"
#include "kernels/feature_params.hpp"

namespace favor::kernels {

/// Chunk length of a causal context's saved states (AttentionOptions::save_causal_states);
/// the CPU kernels' causal chunk (cpu/tiles.hpp) is this.
constexpr int64_t kSavedChunk = 32;
inline int64_t causal_chunks(int64_t n) {
  return (n + kSavedChunk - 1) / kSavedChunk;
}

/// Hybrid attention's estimated part fused with its exact part (cpu/hybrid_causal.cpp):
/// receives each chunk's rows as they are computed.
struct PartHook {
  /// Rows [r0, r0 + rows) of head bh: their [num | den] (rows x (dv + 1)) and log scales,
  /// as part_rows and part_shift would hold them; called from the kernel's threads, each
  /// known by omp_get_thread_num().
  virtual void rows(int64_t bh, int64_t r0, int64_t rows, const float* yx,
                    const double* shift) const = 0;

 protected:
  ~PartHook() = default;
};

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
  const uint8_t* mask;         // [B, Nk], nonzero = key takes part; null = no mask
  int64_t mask_stride_b, mask_stride_n;
  float* ctx_states = nullptr;   // bidirectional: save [S | s] per head here (B*H x F x (dv + 1))
  double* ctx_maxima = nullptr;  // ... and its max per head
  // Causal with AttentionOptions::save_causal_states: the state before each kChunk chunk and
  // after the last (B*H x (chunks + 1) x F x (dv + 1)), their maxima, each row's [num | den]
  // (B*H x N x (dv + 1)). The forward then runs chunks of kChunk tokens.
  float* ctx_chunk_states = nullptr;
  double* ctx_chunk_maxima = nullptr;
  float* ctx_rows = nullptr;
  // Sequence-parallel attention (favor/sequence_parallel.hpp), per head [S | s] (B*H x F x
  // (dv + 1)) and its max: bidirectional, the complete key state of every rank (the key pass
  // is skipped); causal, the state of the keys before key 0 (the earlier ranks' keys).
  const float* init_states = nullptr;
  const double* init_maxima = nullptr;
  // Causal forward: if set, each head's [S | s] after its last key (B*H x F x (dv + 1)) and
  // its max are written here, read by the decoder's prefill; may be init_states/init_maxima
  // (a head's initial state is read before its final state is written).
  float* final_states = nullptr;
  double* final_maxima = nullptr;
  // Causal backward with decay gradients: the distance state of the keys before key 0,
  // sum_{j < 0} (0 - j) phi(k_j) [v_j | 1] relative to init_maxima (B*H x F x (dv + 1)).
  const float* init_distance = nullptr;
  // Bidirectional forward with bf16 GEMMs (AttentionOptions::precision); the facade sets it
  // only where backend().has_bf16().
  bool bf16 = false;
  // Causal forward, a part of hybrid attention (src/hybrid.cpp): if set, each row's
  // unnormalised [num | den] (B*H x nq x (dv + 1)) and its log scale c_i + M_i (B*H x nq),
  // the query's shift plus the key offset it reads at; -inf for a row that saw no key. The
  // true sums are the rows times exp(scale + what every key of the row shares: the query's
  // norm term, the map's constants, the query's decay clock), which the facade adds. out is
  // written as usual, or not at all when null.
  float* part_rows = nullptr;
  double* part_shift = nullptr;
  // The same rows handed to a hook chunk by chunk instead (no buffer of the sequence's size).
  const PartHook* part_hook = nullptr;
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
  // Causal: the forward's saved chunk states, maxima and rows (AttentionParams above).
  const float* ctx_chunk_states = nullptr;
  const double* ctx_chunk_maxima = nullptr;
  const float* ctx_rows = nullptr;
  // Sequence-parallel bidirectional backward in two phases: with r_out, only the query pass
  // runs (dq) and writes each head's R = phi(Q)^T gx (B*H x F x (dv + 1), zeroed by the
  // caller); with r_in, only the key pass runs (dk, dv) with the given R (summed over ranks).
  // Positive-family kernels exchange R'_f = s_f R_f, scaled by the (global) key sums
  // (favor_backward.cpp), so that R' fits float.
  float* r_out = nullptr;
  const float* r_in = nullptr;
  // Causal backward of a part of hybrid attention (no saved context): the merged output y
  // (B*H x nq x dv, C order) and log normaliser lse (B*H x nq, in the frame of part_shift)
  // of the rows; the upstream gradient of row i is then exp(c_i + M_i - lse_i) [dy_i,
  // -dy_i . y_i] (zeros where lse_i is -inf) instead of [dy_i / den_i, -dy_i . y_i / den_i].
  const float* merged_y = nullptr;
  const double* merged_lse = nullptr;
  // Rows per head of dq, dk, dv, merged_y and merged_lse when they are views into longer
  // sequences (a hybrid part's shifted view, src/hybrid.cpp); 0: fwd.nq.
  int64_t head_rows = 0;
  int64_t grad_rows() const { return head_rows > 0 ? head_rows : fwd.nq; }

  /// Head bh's slices of dW and dbias (null when not requested).
  float* head_dw(int64_t bh) const { return dw ? dw + bh * fwd.map.m * fwd.map.d : nullptr; }
  float* head_dbias(int64_t bh) const { return dbias ? dbias + bh * fwd.map.m : nullptr; }
};

}  // namespace favor::kernels
