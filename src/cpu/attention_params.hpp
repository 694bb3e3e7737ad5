#pragma once
// The one plain struct the attention kernels take: raw pointers, element strides per
// axis, sizes and precomputed scalars. The facade (src/attention.cpp) validates and fills
// it; kernels never throw.
#include <cstdint>
#include <vector>

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
  // Sequence-parallel attention (favor/sequence_parallel.hpp), per head [S | s] (B*H x F x
  // (dv + 1)) and its max: bidirectional, the complete key state of every rank (the key pass
  // is skipped); causal, the state of the keys before key 0 (the earlier ranks' keys).
  const float* init_states = nullptr;
  const double* init_maxima = nullptr;
  // Causal backward with decay gradients: the distance state of the keys before key 0,
  // sum_{j < 0} (0 - j) phi(k_j) [v_j | 1] relative to init_maxima (B*H x F x (dv + 1)).
  const float* init_distance = nullptr;
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
  // Sequence-parallel bidirectional backward in two phases: with r_out, only the query pass
  // runs (dq) and writes each head's R = phi(Q)^T gx (B*H x F x (dv + 1), zeroed by the
  // caller); with r_in, only the key pass runs (dk, dv) with the given R (summed over ranks).
  // Positive-family kernels exchange R'_f = s_f R_f, scaled by the (global) key sums
  // (favor_backward.cpp), so that R' fits float.
  float* r_out = nullptr;
  const float* r_in = nullptr;

  /// Head bh's slices of dW and dbias (null when not requested).
  float* head_dw(int64_t bh) const { return dw ? dw + bh * fwd.map.m * fwd.map.d : nullptr; }
  float* head_dbias(int64_t bh) const { return dbias ? dbias + bh * fwd.map.m : nullptr; }
};

/// Per-head buffers a sequence-parallel causal backward keeps between its two phases.
struct CausalBackwardStore {
  std::vector<float> gx;          // [B*H][N][dv + 1]: the upstream gradient in augmented form
  std::vector<float> chunk_s;     // [B*H][chunks][F]: each chunk's starting normaliser
  std::vector<double> chunk_max;  // [B*H][chunks]: ... and max
  std::vector<float> r;           // [B*H][F][dv + 1]: phase A's R of the slice's queries
  std::vector<double> r_max;      // [B*H]: the slice's starting max, R's reference
  /// Sizes (and zeroes) every buffer for `heads` heads of n queries: phase A then allocates
  /// nothing (sequence-parallel calls allocate before the ranks agree to go on).
  void reserve(int64_t heads, int64_t n, int64_t features, int64_t dv);
};

/// Bidirectional FAVOR attention; returns the number of rows written as zeros.
int64_t favor_bidirectional(const AttentionParams& p);
/// Causal FAVOR attention (chunked); returns the number of rows written as zeros.
int64_t favor_causal(const AttentionParams& p);
/// Gradients of bidirectional and causal FAVOR attention.
void favor_backward_bidirectional(const BackwardParams& p);
void favor_backward_causal(const BackwardParams& p);
/// The causal backward in two phases (sequence parallel). Phase A, the forward sweep from
/// fwd.init_states: dq (and the decay gradient), and store.r = the slice's R relative to its
/// starting max. Phase B, the reverse sweep starting from suffix R (relative to exp of
/// suffix_ref[bh], B*H x F x (dv + 1)): dk, dv.
void favor_backward_causal_phase_a(const BackwardParams& p, CausalBackwardStore& store);
void favor_backward_causal_phase_b(const BackwardParams& p, CausalBackwardStore& store,
                                   const float* suffix_r, const double* suffix_ref);

/// Per head, the [S | s] of all keys (max in maxima) and, with distance (not null), the
/// distance state sum_j (nk - j) phi(k_j) [v_j | 1] (B*H x F x (dv + 1) each).
void key_states(const AttentionParams& p, float* states, double* maxima, float* distance);

}  // namespace favor::cpu
