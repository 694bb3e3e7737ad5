#pragma once
// The CPU Transformer-VQ kernels: the contract's params (kernels/vq_params.hpp) and the CPU
// configuration (cpu/config.hpp).
#include <cstdint>

#include "cpu/attention_params.hpp"
#include "kernels/vq_params.hpp"

namespace favor::cpu {

using kernels::VQBackwardParams;
using kernels::VQAssignParams;
using kernels::VQParams;

/// Bidirectional and causal VQ attention; return the number of rows written as zeros.
int64_t vq_bidirectional(const VQParams& p, const Config& config);
int64_t vq_causal(const VQParams& p, const Config& config);
/// Gradients of bidirectional and causal VQ attention.
void vq_backward_bidirectional(const VQBackwardParams& p, const Config& config);
void vq_backward_causal(const VQBackwardParams& p, const Config& config);

/// Sequence-parallel pieces (favor/sequence_parallel.hpp). Per head, [Vsum | n] of every
/// visible key (B*H x c x (dv + 1)).
void vq_key_states(const VQParams& p, const Config& config, float* states);
/// Floats per head of the query-side sums: U (c x dv) and r (c); hard VQ adds the moments
/// T (c x d x dv) and w (c x d) of every code.
int64_t vq_code_sums_size(const VQParams& p);
/// The key pass for given query-side sums (per head, vq_code_sums_size floats, from queries
/// that see every key of the call): adds their part to dv, dk and the assignment part of
/// dcodebook (soft VQ).
void vq_backward_keys(const VQBackwardParams& p, const Config& config, const float* sums);

}  // namespace favor::cpu
