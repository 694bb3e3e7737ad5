#pragma once
// The kernel contract of one streaming FAVOR decoder step (favor::Decoder), free of CPU policy.
// The state is, per head bh = b * heads + h, [S | s] (features x (dv + 1)) relative to
// exp(log_max[bh]). The facade (src/decoder.cpp) validates and fills; kernels never throw.
#include <cstdint>
#include <vector>

#include "kernels/attention_params.hpp"
#include "kernels/band_params.hpp"

namespace favor::kernels {

/// A decoder row's decay clock (row_positions[b]) after one token: it counts every token
/// from the row's first kept one on (a masked token after it too: the distance i - j the
/// attention op's decay measures), none before it (left padding). A kept token's key takes
/// the clock before its tick.
inline bool clock_ticks(bool keep, int64_t clock) {
  return keep || clock > 0;
}

/// Appends step.nk = T tokens step.k, step.v (step.mask: masked tokens are skipped) to the
/// state. Key j of row b that takes part gets the decay position of the row's clock before
/// it (row_positions[b], advanced by clock_ticks over the step's earlier tokens).
struct DecoderAppend {
  AttentionParams step;          // batch, heads, d, dv, map, k, v, nk, mask
  const float* wt;               // [map.w_sets][d][m]: W^T per parameter set
  float* sums;                   // [B*H][F][dv + 1]
  double* log_max;               // [B*H]
  const int64_t* row_positions;  // [B]: each row's clock before the step (clock_ticks)
};

/// Attends step.nq = T queries step.q to the state, into step.out [B, H, T, dv]; a head with
/// no key yet gives zeros.
struct DecoderQuery {
  AttentionParams step;  // batch, heads, d, dv, map, q, nq, out
  const float* wt;       // [map.w_sets][d][m]
  const float* sums;     // [B*H][F][dv + 1]
  // Hybrid attention's decoder (favor::HybridDecoder): if set, each query's [num | den]
  // ([B*H][T][dv + 1]) and its log scale c + log_max[bh] ([B*H][T]; -inf: an empty head),
  // the query's shift plus the state's stabiliser. step.out may then be null.
  float* part_rows = nullptr;
  double* part_shift = nullptr;
  const double* log_max = nullptr;
};

/// One fused decode step (Decoder::step): appends one token per row, step.k and step.v
/// (nk = 1; step.mask [B, 1]: a masked row's state is left as it was), then attends
/// step.q (nq = 1) to the state after it, into step.out: append then query in one pass.
/// The workspace vectors belong to the caller (the decoder) and are grown, never shrunk,
/// before any parallel region: a step allocates nothing once they have their size.
struct DecoderStep {
  AttentionParams step;          // batch, heads, d, dv, map, q, k, v, out, mask
  const float* wt;               // [map.w_sets][d][m]
  float* sums;                   // [B*H][F][dv + 1]
  double* log_max;               // [B*H]
  const int64_t* row_positions;  // [B]: each row's kept tokens before the step
  std::vector<float>* workspace;
  std::vector<double>* workspace_d;
  // Hybrid attention's decoder (HybridDecoder::step): where set, the token appended is the
  // one leaving the window (step.k, step.v; null: none leaves it) and each query's row of
  // the state, at its log scale c + log_max + weight(|q|^2, row_positions[b] - 1), is merged
  // with the exact part of `band` (its ring and sinks; part_rows unused) into step.out, the
  // batch formula with one query (band_decode's rows, one merge).
  const BandDecodeParams* band = nullptr;
  QueryWeight weight{};
  // The token entering the window (with band and a window): each head's key and value rows
  // ([B, H, 1, X] at their strides) are written into ring slot `enter_slot` (ring_k_out,
  // ring_v_out: band's ring) by the head's thread, after it read the leaving token there
  // (step.k, step.v: views of that slot) and before the exact part reads the ring. The ring's
  // flags are the caller's. Null: nothing enters (a window of 0).
  const float* enter_k = nullptr;
  Shape4 enter_k_strides{};
  const float* enter_v = nullptr;
  Shape4 enter_v_strides{};
  float* ring_k_out = nullptr;  // [B*H][window][D]
  float* ring_v_out = nullptr;  // [B*H][window][Dv]
  int64_t enter_slot = 0;
};

}  // namespace favor::kernels
