#pragma once
// The exact part of hybrid attention (src/hybrid.cpp), part of the kernel contract: softmax
// terms over each query's window and sinks, as unnormalised rows with their log scale (the
// forward), and the gradient of those terms given the merged output (the backward).
#include <cstdint>

#include "kernels/attention_params.hpp"

namespace favor::kernels {

// An estimated part of hybrid attention (src/hybrid.cpp) to merge with the exact terms:
// [num | den] rows (dv + 1 floats each) at full log scales `shift` (-inf: no key). Row i of
// the call reads the part's row r = i - offset (reversed: n - 1 - offset - i) when first <= r
// < first + rows, at index bh * head_stride + r - first (head_stride 0: one head's rows).
struct BandPart {
  const float* data = nullptr;
  const double* shift = nullptr;
  int64_t offset = 0, first = 0, rows = 0, head_stride = 0;
  bool reversed = false;
};

struct BandParams {
  // q, k, v, sizes (nq == nk), the key mask and out: row i's exact terms [sum exp(s_ij -
  // M_i) v_j | sum exp(s_ij - M_i)] at log scale M_i merged with the parts' rows, y_i =
  // sum_p e^(L_pi - S_i) num_pi / sum_p e^(L_pi - S_i) den_pi, S_i = max_p L_pi, into out
  // (zero for a row with no key).
  AttentionParams p;
  double scale = 1.0;  // s_ij = scale q_i . k_j
  bool causal = false;
  int64_t window = 0;  // causal {i - window < j <= i}; bidirectional {|i - j| < window}
  int64_t sinks = 0;
  // [B][sinks]: batch row b's sink keys (its first visible keys), -1 past the last.
  const int64_t* sink_index = nullptr;
  BandPart parts[2];
  int part_count = 0;
  // B*H x nq, where set: lse_i = S_i + log den_i (-inf: a zero row).
  double* lse = nullptr;
};

/// |q|^2 of d values at `stride`, in double (four sums: no chain of dependent adds).
inline double squared_norm(const float* q, int64_t d, int64_t stride) {
  double part[4] = {0.0, 0.0, 0.0, 0.0};
  int64_t x = 0;
  for (; x + 4 <= d; x += 4)
    for (int64_t u = 0; u < 4; ++u) {
      const double e = q[(x + u) * stride];
      part[u] += e * e;
    }
  for (; x < d; ++x) part[0] += double(q[x * stride]) * q[x * stride];
  return (part[0] + part[1]) + (part[2] + part[3]);
}

/// What an estimated part's rows leave out of query i's log scale (they cancel in a plain
/// call, not against exact terms): norm |q_i|^2 (the query's norm term: -+ scale / 2 by the
/// map's key norm, or 0), the features' constant on both sides (per head, as a log) and,
/// with decay, minus the head's rate times the query's row in the part's view.
// (the rule; QueryWeight holds the constants of a call)
inline double query_log_weight(const FeatureParams& fp, int64_t bh, double norm, double q2,
                               double constant, int64_t row) {
  double g = norm * q2 + constant;
  if (fp.decay_rate) g -= fp.head_decay(bh) * double(row);
  return g;
}
struct QueryWeight {
  double norm = 0.0;
  const double* constant = nullptr;  // [B*H]
  double at(const FeatureParams& fp, int64_t bh, double q2, int64_t row) const {
    return query_log_weight(fp, bh, norm, q2, constant[bh], row);
  }
};

// Causal hybrid attention in one sweep: the estimated part (causal FAVOR over `part`, the
// view whose row r is query r + offset; offset < nq) hands each chunk of rows to the exact
// part, merged as they come (no buffer of the sequence's size).
struct HybridCausalParams {
  BandParams band;  // parts unused: the sweep's rows are the one part
  AttentionParams part;
  int64_t offset = 0;
  QueryWeight weight;  // of query i at view row i - offset
  // Where set (a saved context): every row's merged y (B*H x nq x dv, C order) and the
  // estimated part's full log scale of each of its rows (B*H x part.nq); band.lse then set
  // too. The part's chunk states and rows: part.ctx_chunk_states, _maxima, ctx_rows.
  float* saved_y = nullptr;
  double* saved_scale = nullptr;
};

// A hybrid decoder's queries (src/hybrid_decoder.cpp): per (batch, head) and query t, the
// exact part over the stored keys (the ring's `window` slots, then the `sinks`), each key
// taking part where its flag is set, merged with the linear state's row as band_attention
// merges a part (the same merge).
struct BandDecodeParams {
  const float* q;  // [B, H, T, D] at q_strides
  Shape4 q_strides;
  float* out;  // [B, H, T, Dv] at out_strides
  Shape4 out_strides;
  int64_t batch = 0, heads = 0, T = 0, d = 0, dv = 0;
  double scale = 1.0;
  int64_t window = 0, sinks = 0;
  const float* ring_k = nullptr;  // [B*H][window][D], [B*H][window][Dv]
  const float* ring_v = nullptr;
  const uint8_t* ring_live = nullptr;  // [B][window]
  const float* sink_k = nullptr;       // [B*H][sinks][D], [B*H][sinks][Dv]
  const float* sink_v = nullptr;
  const uint8_t* sink_live = nullptr;  // [B][sinks]
  // The linear state's rows [B*H][T][Dv + 1] at full log scales [B*H][T] (-inf: none).
  const float* part_rows = nullptr;
  const double* part_shift = nullptr;
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
