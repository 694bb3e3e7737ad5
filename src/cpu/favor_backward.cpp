// Backward pass of bidirectional FAVOR attention, per (batch, head), in three tiled passes
// (memory O(tile F + F Dv)):
//   1. keys: the forward state [S | s] (cpu/key_state.hpp), relative to the final key max;
//   2. queries: recompute phi(q) and [num | den] = phi [S | s]; the upstream gradient in
//      augmented form gx = [dy / den, -(dy . y) / den]; dphi(Q) = gx [S | s]^T, which the
//      feature backward turns into dq; and R += phi(Q)^T gx (F x (Dv + 1));
//   3. keys again: dphi(K) = [V | 1] R^T, dV = phi(K) R[:, :Dv], and dk.
// With stabilised features every product dphi * phi equals the unstabilised one (the shifts
// cancel), so the gradients are exact: docs/gradients.md.
// Positive family: a query's features are stabilised against the key sums, phi_f <= 1 / s_f,
// so feature f of R could overflow float where s_f is tiny (FAVOR# fits, large norms: dk was
// NaN). R is kept as R'_f = s_f R_f (from phi_f s_f <= 1) and the key pass uses
// phi(K)_f / s_f <= 1 with it: every product is the same, nothing overflows.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/attention_params.hpp"
#include "cpu/blas.hpp"
#include "cpu/feature_grad.hpp"
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
  std::vector<float> yx, gx, dphi, pa, dx, dvx, Sx, R, s, log_s, inv_s, phis;
  Workspace(int64_t d, int64_t m, int64_t F, int64_t dv)
      : tile(d, m, F, dv),
        yx(kRowTile * (dv + 1)),
        gx(kRowTile * (dv + 1)),
        dphi(kRowTile * F),
        pa(kRowTile * m),
        dx(kRowTile * d),
        dvx(kRowTile * dv),
        Sx(F * (dv + 1)),
        R(F * (dv + 1)),
        s(F),
        log_s(F),
        inv_s(F),
        phis(kRowTile * F) {}
};

void run_head(const BackwardParams& bp, int64_t b, int64_t h, Workspace& ws) {
  const AttentionParams& p = bp.fwd;
  const int64_t m = p.map.m, d = p.d, dv = p.dv, F = p.map.features(), ld = dv + 1;
  HeadState state{ws.Sx.data(), F, dv};
  const int64_t bh = b * p.heads + h;
  if (bp.ctx_states) {  // the forward pass saved the key state
    std::copy_n(bp.ctx_states + bh * F * ld, F * ld, ws.Sx.data());
    state.max = bp.ctx_maxima[bh];
  } else {
    state.clear();
    accumulate_keys(p, b, h, 0, p.nk, ws.tile, state);
  }
  if (std::isinf(state.max)) return;  // no visible key: the forward wrote zeros, no gradient
  const bool scaled = positive_family(p.map.kernel);
  if (scaled) {
    state.copy_normaliser(ws.s.data());
    log_or_neg_inf(ws.s.data(), ws.log_s.data(), F);
    for (int64_t f = 0; f < F; ++f)  // 0 for a dead feature (s_f below FLT_MIN: phi_f = 0)
      ws.inv_s[f] = std::isinf(ws.log_s[f]) ? 0.0f : 1.0f / ws.s[f];
  }
  float* dw = bp.head_dw(bh);
  float* db = bp.head_dbias(bh);

  // Queries: dq, and R = phi(Q)^T gx (sequence parallel: R is given, summed over ranks).
  std::fill(ws.R.begin(), ws.R.end(), 0.0f);
  if (bp.r_in) std::copy_n(bp.r_in + bh * F * ld, F * ld, ws.R.data());
  const float* qh = p.q + b * p.q_strides[0] + h * p.q_strides[1];
  const float* dyh = bp.dy + b * bp.dy_strides[0] + h * bp.dy_strides[1];
  KeyTile& t = ws.tile;
  for (int64_t i0 = 0; i0 < p.nq && !bp.r_in; i0 += kRowTile) {
    const int64_t rows = std::min(kRowTile, p.nq - i0);
    gather_rows(qh + i0 * p.q_strides[2], p.q_strides[2], p.q_strides[3], rows, d, p.map.sqrt_scale,
                t.x.data(), nullptr);
    project_rows(t.x.data(), rows, d, p.map.head_w(bh), m, t.a.data(), p.map.head_bias(bh));
    for (int64_t r = 0; r < rows; ++r) {
      const float* a = t.a.data() + r * m;
      query_features(p.map.kernel, a, m, query_shift(p.map.kernel, a, m, ws.log_s.data()),
                     ws.log_s.data(), t.phi.data() + r * F);
    }
    gemm(false, false, rows, ld, F, 1.0f, t.phi.data(), F, ws.Sx.data(), ld, 0.0f, ws.yx.data(),
         ld);
    upstream_rows(ws.yx.data(), dyh + i0 * bp.dy_strides[2], bp.dy_strides[2], bp.dy_strides[3],
                  rows, dv, ws.gx.data());
    gemm(false, true, rows, F, ld, 1.0f, ws.gx.data(), ld, ws.Sx.data(), ld, 0.0f, ws.dphi.data(),
         F);
    const float* phi_r = t.phi.data();  // R' = (phi s)^T gx (positive family), else R
    if (scaled) {
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t f = 0; f < F; ++f) ws.phis[r * F + f] = t.phi[r * F + f] * ws.s[f];
      phi_r = ws.phis.data();
    }
    gemm(true, false, F, ld, rows, 1.0f, phi_r, F, ws.gx.data(), ld, 1.0f, ws.R.data(), ld);
    feature_backward(p.map, bh, nullptr, rows, t.x.data(), t.phi.data(), ws.dphi.data(),
                     ws.pa.data(), bp.dq + (bh * p.nq + i0) * d, dw, db);
  }

  if (bp.r_out) {  // the query phase of a sequence-parallel call ends here
    std::copy_n(ws.R.data(), F * ld, bp.r_out + bh * F * ld);
    return;
  }

  // Keys: dk and dv (masked keys keep their zero gradients), and the gradients of their
  // feature weights.
  const KeyRows keys{bp.dlogw ? bp.dlogw + bh * m : nullptr};
  for (int64_t next = 0; next < p.nk;) {
    const int64_t rows = gather_key_tile(p, b, h, &next, p.nk, t);
    if (rows == 0) break;
    project_key_tile(p, bh, rows, t);
    for (int64_t r = 0; r < rows; ++r) {
      float* phi = t.phi.data() + r * F;
      key_features(p.map, bh, t.a.data() + r * m, t.g[r] - state.max, phi);
      if (scaled)
        for (int64_t f = 0; f < F; ++f) phi[f] *= ws.inv_s[f];  // phi / s <= 1, with R'
    }
    gemm(false, true, rows, F, ld, 1.0f, t.vx.data(), ld, ws.R.data(), ld, 0.0f, ws.dphi.data(), F);
    gemm(false, false, rows, dv, F, 1.0f, t.phi.data(), F, ws.R.data(), ld, 0.0f, ws.dvx.data(),
         dv);
    feature_backward(p.map, bh, &keys, rows, t.x.data(), t.phi.data(), ws.dphi.data(), ws.pa.data(),
                     ws.dx.data(), dw, db);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t j = t.index[r];
      std::copy(ws.dx.data() + r * d, ws.dx.data() + (r + 1) * d, bp.dk + (bh * p.nk + j) * d);
      std::copy(ws.dvx.data() + r * dv, ws.dvx.data() + (r + 1) * dv, bp.dv + (bh * p.nk + j) * dv);
    }
  }
}

}  // namespace

void favor_backward_bidirectional(const BackwardParams& bp, const Config& config) {
  const AttentionParams& p = bp.fwd;
  backward_over_heads<Workspace>(
      p.batch * p.heads, config.threads,
      [&](int64_t bh, Workspace& ws) { run_head(bp, bh / p.heads, bh % p.heads, ws); }, p.d,
      p.map.m, p.map.features(), p.dv);
}

}  // namespace favor::cpu
