#pragma once
// The exact part of hybrid attention (src/hybrid.cpp), part of the kernel contract: softmax
// terms over each query's window and sinks, as unnormalised rows with their log scale (the
// forward), and the gradient of those terms given the merged output (the backward).
#include <cstdint>

#include "kernels/attention_params.hpp"

namespace favor::kernels {

struct BandParams {
  // q, k, v, sizes (nq == nk) and the key mask; part_rows and part_shift receive each row's
  // [sum exp(s_ij - M_i) v_j | sum exp(s_ij - M_i)] and M_i (-inf: no exact key).
  AttentionParams p;
  double scale = 1.0;  // s_ij = scale q_i . k_j
  bool causal = false;
  int64_t window = 0;  // causal {i - window < j <= i}; bidirectional {|i - j| < window}
  int64_t sinks = 0;
  // [B][sinks]: batch row b's sink keys (its first visible keys), -1 past the last.
  const int64_t* sink_index = nullptr;
};

struct BandBackwardParams {
  BandParams band;
  const float* dy;
  Shape4 dy_strides;
  // The merged output (B*H x nq x dv, C order) and log normaliser (B*H x nq, logit units;
  // -inf: a zero row): P_ij = exp(s_ij - lse_i) is the pair's weight in the merged row.
  const float* merged_y;
  const double* merged_lse;
  // C-contiguous [B, H, N, X]; the exact terms' gradients are added.
  float* dq;
  float* dk;
  float* dv;
};

}  // namespace favor::kernels
