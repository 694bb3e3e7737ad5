#pragma once
// Exact softmax attention kernels (blockwise, online softmax). Same params struct as the
// FAVOR kernels; w, m and kernel are unused, sqrt_scale holds sqrt(scale).
#include "cpu/attention_params.hpp"

namespace favor::cpu {

/// Returns the number of rows with no visible key (written as zeros).
int64_t exact_attention_f32(const AttentionParams& p, bool causal, const Config& config);
int64_t exact_attention_f64(const AttentionParams& p, bool causal, const Config& config);
/// Gradients of exact attention (float32, blockwise, from the row log-sum-exp).
void exact_attention_backward(const BackwardParams& p, bool causal, const Config& config);

}  // namespace favor::cpu
