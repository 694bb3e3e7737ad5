// Bidirectional FAVOR attention with bf16 GEMMs (AttentionOptions::precision = bf16): the
// algorithm of favor_bidirectional.cpp, one head per task, with every GEMM operand rounded
// to bf16 and fp32 accumulation (cpu/bf16_gemm.hpp):
//   keys, in tiles: a = bf16(k) bf16(W)^T; phi in fp32 (running-max stabiliser), then
//     [S | s] += bf16(phi)^T bf16([V | 1]) into the fp32 state;
//   queries, in tiles: a = bf16(q) bf16(W)^T; phi in fp32; [y | den] = bf16(phi) bf16([S | s]).
// Norms, shifts, the stabiliser, exp and the division stay in fp32 / double. The added error
// is bounded in docs/numerics.md ("bf16 forward").
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/attention_params.hpp"
#include "cpu/bf16_gemm.hpp"
#include "cpu/feature_tile.hpp"
#include "cpu/head_state.hpp"
#include "cpu/key_state.hpp"
#include "cpu/schedule.hpp"
#include "cpu/tiles.hpp"
#include "cpu/vec_math.hpp"

namespace favor::cpu {
namespace {

struct Workspace {
  KeyTile tile;
  std::vector<bf16_t> w, x, phi, vx, Sx_b;
  std::vector<float> Sx, yx, s, log_s;
  Workspace(int64_t d, int64_t m, int64_t F, int64_t dv)
      : tile(d, m, F, dv),
        w(m * d),
        x(kRowTile * d),
        phi(kRowTile * F),
        vx(kRowTile * (dv + 1)),
        Sx_b(F * (dv + 1)),
        Sx(F * (dv + 1)),
        yx(kRowTile * (dv + 1)),
        s(F),
        log_s(F) {}
};

// a[rows x m] = bf16(x) bf16(W)^T (+ bias), W already in ws.w.
void project_bf16(const AttentionParams& p, int64_t bh, int64_t rows, Workspace& ws) {
  const int64_t m = p.map.m;
  to_bf16(ws.tile.x.data(), ws.x.data(), rows * p.d);
  gemm_bf16(false, true, rows, m, p.d, ws.x.data(), p.d, ws.w.data(), p.d, 0.0f, ws.tile.a.data(),
            m);
  const float* bias = p.map.head_bias(bh);
  if (!bias) return;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t f = 0; f < m; ++f) ws.tile.a[r * m + f] += bias[f];
}

void accumulate_keys_bf16(const AttentionParams& p, int64_t b, int64_t h, HeadState& state,
                          Workspace& ws) {
  const int64_t m = p.map.m, F = state.features, ld = state.ld(), bh = b * p.heads + h;
  KeyTile& t = ws.tile;
  for (int64_t next = 0; next < p.nk;) {
    const int64_t rows = gather_key_tile(p, b, h, &next, p.nk, t);
    if (rows == 0) break;
    project_bf16(p, bh, rows, ws);
    double tile_max = -INFINITY;
    for (int64_t r = 0; r < rows; ++r) {
      t.g[r] = p.map.key_log_weight(t.half_norm2[r], bh, p.first_position + t.index[r]);
      tile_max = std::max(tile_max, key_log_max(p.map, bh, t.a.data() + r * m, t.g[r]));
    }
    if (tile_max > state.max) state.raise_max(tile_max);
    for (int64_t r = 0; r < rows; ++r)
      key_features(p.map, bh, t.a.data() + r * m, t.g[r] - state.max, t.phi.data() + r * F);
    to_bf16(t.phi.data(), ws.phi.data(), rows * F);
    to_bf16(t.vx.data(), ws.vx.data(), rows * ld);
    gemm_bf16(true, false, F, ld, rows, ws.phi.data(), F, ws.vx.data(), ld, 1.0f, state.Sx, ld);
  }
}

int64_t attend_queries_bf16(const AttentionParams& p, int64_t b, int64_t h, const HeadState& state,
                            Workspace& ws) {
  const int64_t m = p.map.m, F = state.features, ld = state.ld(), bh = b * p.heads + h;
  float* oh = p.out + b * p.out_strides[0] + h * p.out_strides[1];
  if (std::isinf(state.max)) {  // no visible key: every row is defined as zeros
    for (int64_t i = 0; i < p.nq; ++i)
      for (int64_t x = 0; x < p.dv; ++x) oh[i * p.out_strides[2] + x * p.out_strides[3]] = 0.0f;
    return p.nq;
  }
  const float* qh = p.q + b * p.q_strides[0] + h * p.q_strides[1];
  if (positive_family(p.map.kernel)) {
    state.copy_normaliser(ws.s.data());
    log_or_neg_inf(ws.s.data(), ws.log_s.data(), F);
  }
  to_bf16(state.Sx, ws.Sx_b.data(), F * ld);
  int64_t zero_rows = 0;
  for (int64_t i0 = 0; i0 < p.nq; i0 += kRowTile) {
    const int64_t rows = std::min(kRowTile, p.nq - i0);
    gather_rows(qh + i0 * p.q_strides[2], p.q_strides[2], p.q_strides[3], rows, p.d,
                p.map.sqrt_scale, ws.tile.x.data(), nullptr);
    project_bf16(p, bh, rows, ws);
    for (int64_t r = 0; r < rows; ++r) {
      const float* a = ws.tile.a.data() + r * m;
      const float c = query_shift(p.map.kernel, a, m, ws.log_s.data());
      query_features(p.map.kernel, a, m, c, ws.log_s.data(), ws.tile.phi.data() + r * F);
    }
    to_bf16(ws.tile.phi.data(), ws.phi.data(), rows * F);
    gemm_bf16(false, false, rows, ld, F, ws.phi.data(), F, ws.Sx_b.data(), ld, 0.0f, ws.yx.data(),
              ld);
    zero_rows += write_rows(ws.yx.data(), rows, p.dv, oh + i0 * p.out_strides[2], p.out_strides[2],
                            p.out_strides[3]);
  }
  return zero_rows;
}

}  // namespace

int64_t favor_bidirectional_bf16(const AttentionParams& p, const Config& config) {
  const int64_t F = p.map.features();
  const Schedule plan = heads_only(p.batch * p.heads, config.threads);
  std::vector<Workspace> spaces = make_workspaces<Workspace>(plan.team, p.d, p.map.m, F, p.dv);
  return for_each_head(plan, spaces, [&](int64_t bh, Workspace& ws) {
    const int64_t b = bh / p.heads, h = bh % p.heads;
    to_bf16(p.map.head_w(bh), ws.w.data(), p.map.m * p.d);
    HeadState state{ws.Sx.data(), F, p.dv};
    state.clear();
    accumulate_keys_bf16(p, b, h, state, ws);
    if (p.ctx_states) {  // the fp32 state, for the backward pass
      const int64_t n = F * state.ld();
      std::copy(state.Sx, state.Sx + n, p.ctx_states + bh * n);
      p.ctx_maxima[bh] = state.max;
    }
    return attend_queries_bf16(p, b, h, state, ws);
  });
}

}  // namespace favor::cpu
