// Bidirectional Transformer-VQ attention, per (batch, head):
//   1. keys, in tiles of kRowTile visible keys: assign (nearest code, or p(s|k)) and add
//      [v | 1] to the per-code state [Vsum | n] (hard: row by row; soft: one GEMM P^T [V | 1]);
//   2. log n once;
//   3. queries, in tiles: L = scale Q C^T (one GEMM), weights exp(L - m) row by row (the
//      stabiliser of cpu/vq_state.hpp), [num | den] = X [Vsum | n] (one GEMM), num / den.
// Sequence parallel: init_states replaces step 1 (every rank's [Vsum | n], summed by the
// caller from vq_key_states). Memory O(threads * kRowTile * c). Each head is one task on one thread
// (no split of a head over threads): the result is the same bits for any thread count.
#include <algorithm>
#include <vector>

#include "cpu/head_state.hpp"
#include "cpu/schedule.hpp"
#include "cpu/tiles.hpp"
#include "cpu/vec_math.hpp"
#include "cpu/vq_assign.hpp"
#include "cpu/vq_params.hpp"
#include "cpu/vq_state.hpp"

namespace favor::cpu {
namespace {

// Fills ws's state with [Vsum | n] over every visible key of head (b, h).
void key_state(const VQParams& p, int64_t b, int64_t h, const CodeTable& table, VQWorkspace& ws) {
  std::fill(ws.sv.begin(), ws.sv.begin() + p.codes * ws.ld(), 0.0f);
  float* vx = ws.state() + p.codes * ws.ld();  // a tile's [V | 1], below the state
  int64_t next = 0;
  for (;;) {
    const int64_t rows = gather_visible_keys(p, b, h, &next, p.base.nk, vx, ws);
    if (rows == 0) break;
    assign_keys(p, table, rows, nullptr, ws);
    add_to_state(p, rows, vx, nullptr, ws);
  }
}

int64_t attend_queries(const VQParams& p, int64_t b, int64_t h, const float* codebook,
                       VQWorkspace& ws) {
  const AttentionParams& a = p.base;
  const int64_t c = p.codes, ld = ws.ld();
  for (int64_t s = 0; s < c; ++s) ws.count[s] = ws.state()[s * ld + a.dv];
  log_or_neg_inf(ws.count.data(), ws.log_n.data(), c);
  float* oh = a.out + b * a.out_strides[0] + h * a.out_strides[1];
  int64_t zero_rows = 0;
  for (int64_t i0 = 0; i0 < a.nq; i0 += ws.rows) {
    const int64_t rows = std::min(ws.rows, a.nq - i0);
    query_logits(p, b, h, i0, rows, codebook, c, ws);
    for (int64_t r = 0; r < rows; ++r) {
      float* row = ws.xg.data() + r * c;
      code_weights(row, ws.log_n.data(), c, row);
    }
    gemm(false, false, rows, ld, c, 1.0f, ws.xg.data(), c, ws.state(), ld, 0.0f, ws.yx.data(), ld);
    zero_rows += write_rows(ws.yx.data(), rows, a.dv, oh + i0 * a.out_strides[2], a.out_strides[2],
                            a.out_strides[3]);
  }
  return zero_rows;
}

}  // namespace

int64_t vq_bidirectional(const VQParams& p, const Config& config) {
  const int64_t size = p.codes * (p.base.dv + 1);
  return vq_forward_over_heads(
      p, config.threads, kRowTile,
      [&](int64_t b, int64_t h, const float* codebook, const CodeTable& table, VQWorkspace& ws) {
        if (p.init_states) {  // every rank's keys, summed by the caller
          const float* given = p.init_states + (b * p.base.heads + h) * size;
          std::copy(given, given + size, ws.state());
        } else {
          key_state(p, b, h, table, ws);
        }
        return attend_queries(p, b, h, codebook, ws);
      });
}

void vq_key_states(const VQParams& p, const Config& config, float* states) {
  const int64_t size = p.codes * (p.base.dv + 1);
  vq_forward_over_heads(
      p, config.threads, kRowTile,
      [&](int64_t b, int64_t h, const float*, const CodeTable& table, VQWorkspace& ws) {
        key_state(p, b, h, table, ws);
        std::copy(ws.state(), ws.state() + size, states + (b * p.base.heads + h) * size);
        return int64_t{0};
      });
}

}  // namespace favor::cpu
