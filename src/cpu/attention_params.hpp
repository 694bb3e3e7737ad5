#pragma once
// The CPU attention kernels: they take the contract's params (kernels/attention_params.hpp)
// and the CPU configuration (cpu/config.hpp: threads, causal chunk length).
#include <cstdint>
#include <vector>

#include "cpu/config.hpp"
#include "cpu/contract.hpp"
#include "kernels/attention_params.hpp"

namespace favor::cpu {

using kernels::AttentionParams;
using kernels::BackwardParams;

/// Per-head buffers a sequence-parallel causal backward keeps between its two phases.
struct CausalBackwardStore {
  std::vector<float> gx;  // [B*H][N][dv + 1]: the upstream gradient in augmented form
  std::vector<float>
      chunk_s;  // [B*H][chunks + 1][F]: each chunk's starting normaliser, then the final one
  std::vector<double> chunk_max;  // [B*H][chunks]: ... and max
  std::vector<float> r;           // [B*H][F][dv + 1]: phase A's R of the slice's queries
  std::vector<double> r_max;      // [B*H]: the slice's starting max, R's reference
  /// Sizes (and zeroes) every buffer for `heads` heads of n queries: phase A then allocates
  /// nothing (sequence-parallel calls allocate before the ranks agree to go on).
  void reserve(int64_t heads, int64_t n, int64_t features, int64_t dv);
};

/// Bidirectional FAVOR attention; returns the number of rows written as zeros.
int64_t favor_bidirectional(const AttentionParams& p, const Config& config);
/// The same for short sequences (cpu/favor_short.cpp): (phi(Q) phi(K)^T) [V | 1], no state.
/// favor_bidirectional takes it when it pays (fewer flops, both sides within one tile, no
/// state to save or start from).
bool favor_bidirectional_short_pays(const AttentionParams& p);
int64_t favor_bidirectional_short(const AttentionParams& p, const Config& config);
/// The same with bf16 GEMMs (p.bf16; only where bf16_supported(): cpu/bf16_gemm.hpp).
int64_t favor_bidirectional_bf16(const AttentionParams& p, const Config& config);
/// Causal FAVOR attention (chunked); returns the number of rows written as zeros.
int64_t favor_causal(const AttentionParams& p, const Config& config);
/// Gradients of bidirectional and causal FAVOR attention.
void favor_backward_bidirectional(const BackwardParams& p, const Config& config);
void favor_backward_causal(const BackwardParams& p, const Config& config);
/// The causal backward in two phases (sequence parallel). Phase A, the forward sweep from
/// fwd.init_states: dq (and the decay gradient), and store.r = the slice's R relative to its
/// starting max. Phase B, the reverse sweep starting from suffix R (relative to exp of
/// suffix_ref[bh], B*H x F x (dv + 1)): dk, dv.
void favor_backward_causal_phase_a(const BackwardParams& p, const Config& config,
                                   CausalBackwardStore& store);
void favor_backward_causal_phase_b(const BackwardParams& p, const Config& config,
                                   CausalBackwardStore& store, const float* suffix_r,
                                   const double* suffix_ref);

/// Per head, the [S | s] of all keys (max in maxima) and, with distance (not null), the
/// distance state sum_j (nk - j) phi(k_j) [v_j | 1] (B*H x F x (dv + 1) each).
void key_states(const AttentionParams& p, const Config& config, float* states, double* maxima,
                float* distance);

}  // namespace favor::cpu
