// Backward pass of bidirectional Transformer-VQ attention, per (batch, head), in three tile
// sweeps that recompute what they need (notation of cpu/vq_grad_tile.hpp):
//   1. keys: the per-code sums Vsum = p^T V (c x dv) and n = p^T 1;
//   2. queries: P = a / den, y = P Vsum, delta_i = dy_i . y_i; G = dL/dl =
//      P o (dy Vsum^T - delta n^T), dq = scale G C, dC += scale G^T Q; then the per-code
//      states the keys need: U = P^T dy (c x dv), r = P^T delta, and for hard VQ the
//      straight-through key gradient by code (cpu/vq_key_routes.hpp): the codes with few keys
//      directly, dk_j += scale sum_i P_{i,z_j} (dy_i . v_j - delta_i) q_i, the others through
//      the moments T = P^T vec(q dy^T) (c_T x d x dv) and w = P^T (delta q) over their
//      columns of P only;
//   3. keys: dv_j = p_j U; hard: dk_j = scale (T_{z_j} v_j - w_{z_j}) for the moment codes
//      (straight through); soft: dL/dp_j = U v_j - r, then the chain rule through p(.|k_j).
// Time O(N c (d + dv)) (soft); hard adds sum_s min(2 N n_s (d + dv), 2 N d dv) for the key
// gradient, at most O(N c d dv). Memory per thread O(tile (c + d dv) + c d dv),
// independent of N (the direct keys number fewer than c d dv / (d + dv)).
// Sequence parallel (favor/sequence_parallel.hpp): sweep 1 is replaced by the key sums of
// every rank (fwd.init_states), sweep 2 writes its per-code states (code_sums_out) and
// stops; sweep 3 runs in vq_backward_keys with the states summed over ranks. Every code then
// takes the moment route (the other ranks' queries reach this rank's keys only that way).
#include <algorithm>
#include <vector>

#include "cpu/blas.hpp"
#include "cpu/vec_math.hpp"
#include "cpu/vq_assign.hpp"
#include "cpu/vq_grad_tile.hpp"
#include "cpu/vq_key_routes.hpp"
#include "cpu/vq_params.hpp"
#include "cpu/vq_state.hpp"

namespace favor::cpu {
namespace {

constexpr int64_t kTile = kVQGradTile;

struct Workspace {
  std::vector<float> qt, kt, vt, dyt, pk, l, g, y, delta, x, colsum;
  std::vector<float> vsum, n, logn, U, r, T, wsum;  // per-code states of the head
  std::vector<int32_t> z;
  KeyRoutes routes;  // hard VQ: direct or moment route of each code
  Workspace(int64_t c, int64_t d, int64_t dv, bool hard, int64_t nk, bool all_moments)
      : qt(kTile * d),
        kt(kTile * d),
        vt(kTile * dv),
        dyt(kTile * dv),
        pk(kTile * c),
        l(kTile * c),
        g(kTile * c),
        y(kTile * dv),
        delta(kTile),
        x(hard ? kTile * (d * dv + d) : 0),
        colsum(c),
        vsum(c * dv),
        n(c),
        logn(c),
        U(c * dv),
        r(c),
        T(hard ? c * d * dv : 0),
        wsum(hard ? c * d : 0),
        z(kTile),
        routes(c, d, dv, hard ? kTile : 0, hard ? nk : 0, all_moments) {}
};

// 3. Keys: dv (dv = beta dv + p U), and dk through the quantised key (hard) or p(.|k) (soft),
// from the per-code states U, r and (hard) T, w in ws.
void key_pass(const VQBackwardParams& bp, const CodeTable& table, int64_t bh, Workspace& ws,
              float* dC, float dv_beta) {
  const VQParams& p = bp.fwd;
  const AttentionParams& a = p.base;
  const int64_t b = bh / a.heads, h = bh % a.heads, c = p.codes, d = a.d, dv = a.dv;
  const bool hard = p.tau == 0.0f;
  const float* C = p.head_codebook(bh);
  const float scale = p.scale;
  for (int64_t j0 = 0; j0 < a.nk; j0 += kTile) {
    const int64_t rows = std::min(kTile, a.nk - j0);
    gather_head_rows(a.k, a.k_strides, b, h, j0, rows, d, ws.kt.data());
    gather_head_rows(a.v, a.v_strides, b, h, j0, rows, dv, ws.vt.data());
    key_weights(p, table, b, ws.kt.data(), j0, rows, ws.pk.data(), ws.z.data());
    gemm(false, false, rows, dv, c, 1.0f, ws.pk.data(), c, ws.U.data(), dv, dv_beta,
         bp.dv + (bh * a.nk + j0) * dv, dv);
    float* dk = bp.dk + (bh * a.nk + j0) * d;
    if (hard) {
      straight_through_dk(ws.T.data(), ws.wsum.data(), ws.routes.moment_codes_of(ws.z.data(), rows),
                          ws.vt.data(), rows, d, dv, scale, dk);
      continue;
    }
    float* dp = ws.g.data();
    gemm(false, true, rows, c, dv, 1.0f, ws.vt.data(), dv, ws.U.data(), dv, 0.0f, dp, c);
    for (int64_t j = 0; j < rows; ++j)
      for (int64_t s = 0; s < c; ++s) dp[j * c + s] -= ws.r[s];
    soft_assign_backward(ws.pk.data(), dp, ws.kt.data(), rows, C, c, d, p.tau, dk, dC,
                         ws.colsum.data());
  }
  if (hard) ws.routes.scatter(bp.dk + bh * a.nk * d);
}

void run_head(const VQBackwardParams& bp, const std::vector<CodeTable>& tables, int64_t bh,
              Workspace& ws, float* dC) {
  const VQParams& p = bp.fwd;
  const AttentionParams& a = p.base;
  const int64_t b = bh / a.heads, h = bh % a.heads, c = p.codes, d = a.d, dv = a.dv;
  const bool hard = p.tau == 0.0f;
  const float* C = p.head_codebook(bh);
  const CodeTable& table = tables[p.codebook_head_stride ? h : 0];
  const float scale = p.scale;

  // 1. Per-code sums of the keys (sequence parallel: of every rank's keys, given; every code
  // on the moment route).
  std::fill(ws.vsum.begin(), ws.vsum.end(), 0.0f);
  std::fill(ws.n.begin(), ws.n.end(), 0.0f);
  ws.routes.reset();
  if (p.init_states) {
    const float* given = p.init_states + bh * c * (dv + 1);
    for (int64_t s = 0; s < c; ++s) {
      std::copy(given + s * (dv + 1), given + s * (dv + 1) + dv, ws.vsum.begin() + s * dv);
      ws.n[s] = given[s * (dv + 1) + dv];
    }
  }
  for (int64_t j0 = 0; j0 < a.nk && !p.init_states; j0 += kTile) {
    const int64_t rows = std::min(kTile, a.nk - j0);
    gather_head_rows(a.k, a.k_strides, b, h, j0, rows, d, ws.kt.data());
    gather_head_rows(a.v, a.v_strides, b, h, j0, rows, dv, ws.vt.data());
    key_weights(p, table, b, ws.kt.data(), j0, rows, ws.pk.data(), ws.z.data());
    gemm(true, false, c, dv, rows, 1.0f, ws.pk.data(), c, ws.vt.data(), dv, 1.0f, ws.vsum.data(),
         dv);
    for (int64_t j = 0; j < rows; ++j)
      for (int64_t s = 0; s < c; ++s) ws.n[s] += ws.pk[j * c + s];
    if (hard) ws.routes.add_keys(ws.z.data(), ws.vt.data(), j0, rows);
  }
  if (hard) ws.routes.finish();
  const int64_t ct = ws.routes.moment_codes(), direct = ws.routes.direct_before(a.nk);
  log_or_neg_inf(ws.n.data(), ws.logn.data(), c);

  // 2. Queries: dq, the logit part of dC, and the per-code states of the keys' gradients.
  std::fill(ws.U.begin(), ws.U.end(), 0.0f);
  std::fill(ws.r.begin(), ws.r.end(), 0.0f);
  if (hard) {
    std::fill(ws.T.begin(), ws.T.begin() + ct * d * dv, 0.0f);
    std::fill(ws.wsum.begin(), ws.wsum.begin() + ct * d, 0.0f);
  }
  for (int64_t i0 = 0; i0 < a.nq; i0 += kTile) {
    const int64_t rows = std::min(kTile, a.nq - i0);
    gather_head_rows(a.q, a.q_strides, b, h, i0, rows, d, ws.qt.data());
    gather_head_rows(bp.dy, bp.dy_strides, b, h, i0, rows, dv, ws.dyt.data());
    float* P = ws.l.data();
    gemm(false, true, rows, c, d, scale, ws.qt.data(), d, C, d, 0.0f, P, c);
    for (int64_t i = 0; i < rows; ++i) code_weights(P + i * c, ws.logn.data(), c, P + i * c);
    gemm(false, false, rows, dv, c, 1.0f, P, c, ws.vsum.data(), dv, 0.0f, ws.y.data(), dv);
    for (int64_t i = 0; i < rows; ++i) {
      const float den = dot(P + i * c, ws.n.data(), c);
      ws.delta[i] = 0.0f;
      if (!(den > 0.0f)) continue;  // no visible key: P_i is zero, so is every gradient
      const float inv = 1.0f / den;
      for (int64_t s = 0; s < c; ++s) P[i * c + s] *= inv;
      for (int64_t x = 0; x < dv; ++x) ws.y[i * dv + x] *= inv;
      ws.delta[i] = dot(ws.dyt.data() + i * dv, ws.y.data() + i * dv, dv);
    }
    float* G = ws.g.data();
    gemm(false, true, rows, c, dv, 1.0f, ws.dyt.data(), dv, ws.vsum.data(), dv, 0.0f, G, c);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t s = 0; s < c; ++s) {
        G[i * c + s] = P[i * c + s] * (G[i * c + s] - ws.delta[i] * ws.n[s]);
        ws.r[s] += P[i * c + s] * ws.delta[i];
      }
    gemm(false, false, rows, d, c, scale, G, c, C, d, 0.0f, bp.dq + (bh * a.nq + i0) * d, d);
    if (dC) gemm(true, false, c, d, rows, scale, G, c, ws.qt.data(), d, 1.0f, dC, d);
    gemm(true, false, c, dv, rows, 1.0f, P, c, ws.dyt.data(), dv, 1.0f, ws.U.data(), dv);
    if (hard) {
      ws.routes.accumulate(P, ws.qt.data(), ws.dyt.data(), ws.delta.data(), rows, direct, scale);
      if (ct > 0)
        add_code_moments(ws.routes.moment_columns(P, rows), ws.qt.data(), ws.dyt.data(),
                         ws.delta.data(), rows, ct, d, dv, ws.T.data(), ws.wsum.data(),
                         ws.x.data());
    }
  }

  if (bp.code_sums_out) {  // sequence parallel: the keys wait for every rank's sums
    save_code_sums(p, ws, bp.code_sums_out + bh * vq_code_sums_size(p));
    return;
  }
  key_pass(bp, table, bh, ws, dC, 0.0f);
}

}  // namespace

void vq_backward_bidirectional(const VQBackwardParams& bp, const Config& config) {
  const VQParams& p = bp.fwd;
  const std::vector<CodeTable> tables = all_code_tables(p);
  vq_backward_over_heads<Workspace>(
      bp, config.threads,
      [&](int64_t bh, Workspace& ws, float* dC) { run_head(bp, tables, bh, ws, dC); }, p.codes,
      p.base.d, p.base.dv, p.tau == 0.0f, p.base.nk, bp.code_sums_out != nullptr);
}

int64_t vq_code_sums_size(const VQParams& p) {
  const int64_t c = p.codes, d = p.base.d, dv = p.base.dv;
  return c * (dv + 1) + (p.tau == 0.0f ? c * d * (dv + 1) : 0);
}

void vq_backward_keys(const VQBackwardParams& bp, const Config& config, const float* sums) {
  const VQParams& p = bp.fwd;
  const std::vector<CodeTable> tables = all_code_tables(p);
  const int64_t size = vq_code_sums_size(p);
  vq_backward_over_heads<Workspace>(
      bp, config.threads,
      [&](int64_t bh, Workspace& ws, float* dC) {
        ws.routes.reset();  // every code on the moment route, numbered as in the codebook
        ws.routes.finish();
        load_code_sums(p, sums + bh * size, ws);
        key_pass(bp, tables[p.codebook_head_stride ? bh % p.base.heads : 0], bh, ws, dC, 1.0f);
      },
      p.codes, p.base.d, p.base.dv, p.tau == 0.0f, p.base.nk, true);
}

}  // namespace favor::cpu
