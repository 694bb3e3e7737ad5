// Backward pass of causal Transformer-VQ attention, exact through the whole prefix (not the
// paper's truncation), per (batch, head) in two block sweeps (notation of
// cpu/vq_grad_tile.hpp; blocks of L rows, p.block):
//   A. forward: prefix sums [Vprev | nprev] of the earlier blocks' key weights and, inside the
//      block, S = tril(a p^T); den = a nprev + S 1, y = (a Vprev + S V) / den, delta = dy . y;
//      G = dL/dl = P o (dy Vprev^T - delta nprev^T + tril(dy V^T - delta) p) -> dq = scale G C,
//      dC += scale G^T Q. Each row's den and delta and each block's nprev are stored.
//   B. reverse: suffix states of the later blocks' queries, U = P^T dy, r = P^T delta and for
//      hard VQ, over the moment codes only (cpu/vq_key_routes.hpp), T = P^T vec(q dy^T),
//      w = P^T (delta q); inside the block A = tril(P p^T) and D = tril(dy V^T - delta):
//      dv = p U + A^T dy; hard: dk = scale (T_z v - w_z) (moment codes) + scale (A o D)^T Q
//      (straight through); soft: dL/dp = V U^T - r + D^T P, then the chain rule through
//      p(.|k). The block's queries then join the suffix states; for hard VQ they also add
//      their part to the keys of the direct codes in earlier blocks, dk_j += scale
//      sum_i P_{i,z_j} (dy_i . v_j - delta_i) q_i (P_{i,z_j} is live there: key j <= i).
// The route of each code depends on the head's keys only (counted in sweep A).
// Sequence parallel (favor/sequence_parallel.hpp): sweep A starts from the earlier ranks' key
// sums (fwd.init_states); sweep B runs over this call's queries only, every code on the
// moment route, and writes its final suffix states (code_sums_out); the later ranks' part
// follows in vq_backward_keys.
// The row shift m_i = max_s (l_is + log n_s^{<=i}) uses the key weights up to row i, so
// P (and the result) does not depend on L. Time O(N c (d + dv) + N L (c + d + dv)) (soft);
// hard adds at most sum_s min(2 N n_s (d + dv), 2 N d dv) for the key gradient (the direct
// route only pairs keys with the queries of later blocks, about half of that); memory
// O(N + (N / L) c) per head stored, and O(L (L + c + d dv) + c d dv) per thread.
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

struct Workspace {
  int64_t L;
  std::vector<float> qt, kt, vt, dyt, pk, a, g, S, D, y, x, colsum, nrun, lognrun;
  std::vector<float> vprev, nprev, U, r, T, wsum;  // prefix (A) and suffix (B) states
  std::vector<float> den, delta, block_n;          // per head: N, N, blocks x c
  std::vector<int32_t> z;
  KeyRoutes routes;  // hard VQ: direct or moment route of each code
  // Sized for a whole head of n rows here, before the parallel region.
  Workspace(int64_t c, int64_t d, int64_t dv, bool hard, int64_t L, int64_t n, bool all_moments)
      : L(L),
        qt(L * d),
        kt(L * d),
        vt(L * dv),
        dyt(L * dv),
        pk(L * c),
        a(L * c),
        g(L * c),
        S(L * L),
        D(L * L),
        y(L * dv),
        x(hard ? L * (d * dv + d) : 0),
        colsum(c),
        nrun(c),
        lognrun(c),
        vprev(c * dv),
        nprev(c),
        U(c * dv),
        r(c),
        T(hard ? c * d * dv : 0),
        wsum(hard ? c * d : 0),
        den(n),
        delta(n),
        block_n((n + L - 1) / L * c),
        z(L),
        routes(c, d, dv, hard ? L : 0, hard ? n : 0, all_moments) {}
};

// Gathers block [s0, s0 + rows) and computes its key weights pk and query weights a: row i's
// shift uses the per-code weight of the keys up to i, nprev (the earlier blocks) plus the
// block's own rows up to i.
void load_block(const VQParams& p, const float* C, const CodeTable& table, int64_t b, int64_t h,
                int64_t s0, int64_t rows, const float* nprev, const float* dy, const Shape4& dys,
                Workspace& ws) {
  const AttentionParams& a = p.base;
  const int64_t c = p.codes, d = a.d, dv = a.dv;
  gather_head_rows(a.q, a.q_strides, b, h, s0, rows, d, ws.qt.data());
  gather_head_rows(a.k, a.k_strides, b, h, s0, rows, d, ws.kt.data());
  gather_head_rows(a.v, a.v_strides, b, h, s0, rows, dv, ws.vt.data());
  gather_head_rows(dy, dys, b, h, s0, rows, dv, ws.dyt.data());
  key_weights(p, table, b, ws.kt.data(), s0, rows, ws.pk.data(), ws.z.data());
  gemm(false, true, rows, c, d, p.scale, ws.qt.data(), d, C, d, 0.0f, ws.a.data(), c);
  std::copy(nprev, nprev + c, ws.nrun.begin());
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t s = 0; s < c; ++s) ws.nrun[s] += ws.pk[i * c + s];
    log_or_neg_inf(ws.nrun.data(), ws.lognrun.data(), c);
    code_weights(ws.a.data() + i * c, ws.lognrun.data(), c, ws.a.data() + i * c);
  }
}

// D = tril(dy V^T - delta) of the block (row stride rows).
void d_matrix(int64_t rows, int64_t dv, const float* delta, Workspace& ws) {
  float* D = ws.D.data();
  gemm(false, true, rows, rows, dv, 1.0f, ws.dyt.data(), dv, ws.vt.data(), dv, 0.0f, D, rows);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j <= i; ++j) D[i * rows + j] -= delta[i];
    std::fill(D + i * rows + i + 1, D + (i + 1) * rows, 0.0f);
  }
}

// S = tril(X pk^T) (rows x rows) for X = a or P.
void tril_product(const float* X, int64_t rows, int64_t c, Workspace& ws) {
  float* S = ws.S.data();
  gemm(false, true, rows, rows, c, 1.0f, X, c, ws.pk.data(), c, 0.0f, S, rows);
  for (int64_t i = 0; i < rows; ++i) std::fill(S + i * rows + i + 1, S + (i + 1) * rows, 0.0f);
}

void run_head(const VQBackwardParams& bp, const std::vector<CodeTable>& tables, int64_t bh,
              Workspace& ws, float* dC) {
  const VQParams& p = bp.fwd;
  const AttentionParams& at = p.base;
  const int64_t b = bh / at.heads, h = bh % at.heads, c = p.codes, d = at.d, dv = at.dv;
  const int64_t n = at.nq, L = ws.L, blocks = (n + L - 1) / L;
  const bool hard = p.tau == 0.0f;
  const float* C = p.head_codebook(bh);
  const CodeTable& table = tables[p.codebook_head_stride ? h : 0];
  const float scale = p.scale;

  // A. Forward sweep: dq and the logit part of dC (sequence parallel: the prefix sums start
  // from the earlier ranks' keys).
  std::fill(ws.vprev.begin(), ws.vprev.end(), 0.0f);
  std::fill(ws.nprev.begin(), ws.nprev.end(), 0.0f);
  if (p.init_states) {
    const float* given = p.init_states + bh * c * (dv + 1);
    for (int64_t s = 0; s < c; ++s) {
      std::copy(given + s * (dv + 1), given + s * (dv + 1) + dv, ws.vprev.begin() + s * dv);
      ws.nprev[s] = given[s * (dv + 1) + dv];
    }
  }
  ws.routes.reset();
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t s0 = blk * L, rows = std::min(L, n - s0);
    std::copy(ws.nprev.begin(), ws.nprev.end(), ws.block_n.begin() + blk * c);
    load_block(p, C, table, b, h, s0, rows, ws.nprev.data(), bp.dy, bp.dy_strides, ws);
    if (hard) ws.routes.add_keys(ws.z.data(), ws.vt.data(), s0, rows);
    float* P = ws.a.data();
    tril_product(P, rows, c, ws);
    gemm(false, false, rows, dv, c, 1.0f, P, c, ws.vprev.data(), dv, 0.0f, ws.y.data(), dv);
    gemm(false, false, rows, dv, rows, 1.0f, ws.S.data(), rows, ws.vt.data(), dv, 1.0f, ws.y.data(),
         dv);
    float* delta = ws.delta.data() + s0;
    for (int64_t i = 0; i < rows; ++i) {
      float den = dot(P + i * c, ws.nprev.data(), c);
      for (int64_t j = 0; j <= i; ++j) den += ws.S[i * rows + j];
      ws.den[s0 + i] = den;
      delta[i] = 0.0f;
      if (!(den > 0.0f)) continue;  // no visible key up to i: P_i is zero
      const float inv = 1.0f / den;
      for (int64_t s = 0; s < c; ++s) P[i * c + s] *= inv;
      for (int64_t x = 0; x < dv; ++x) ws.y[i * dv + x] *= inv;
      delta[i] = dot(ws.dyt.data() + i * dv, ws.y.data() + i * dv, dv);
    }
    d_matrix(rows, dv, delta, ws);
    float* G = ws.g.data();
    gemm(false, true, rows, c, dv, 1.0f, ws.dyt.data(), dv, ws.vprev.data(), dv, 0.0f, G, c);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t s = 0; s < c; ++s) G[i * c + s] -= delta[i] * ws.nprev[s];
    gemm(false, false, rows, c, rows, 1.0f, ws.D.data(), rows, ws.pk.data(), c, 1.0f, G, c);
    for (int64_t i = 0; i < rows * c; ++i) G[i] *= P[i];
    gemm(false, false, rows, d, c, scale, G, c, C, d, 0.0f, bp.dq + (bh * n + s0) * d, d);
    if (dC) gemm(true, false, c, d, rows, scale, G, c, ws.qt.data(), d, 1.0f, dC, d);
    gemm(true, false, c, dv, rows, 1.0f, ws.pk.data(), c, ws.vt.data(), dv, 1.0f, ws.vprev.data(),
         dv);
    for (int64_t j = 0; j < rows; ++j)
      for (int64_t s = 0; s < c; ++s) ws.nprev[s] += ws.pk[j * c + s];
  }

  // B. Reverse sweep: dv, dk and the assignment part of dC.
  std::fill(ws.U.begin(), ws.U.end(), 0.0f);
  std::fill(ws.r.begin(), ws.r.end(), 0.0f);
  if (hard) ws.routes.finish();
  const int64_t ct = ws.routes.moment_codes();
  if (hard) {
    std::fill(ws.T.begin(), ws.T.begin() + ct * d * dv, 0.0f);
    std::fill(ws.wsum.begin(), ws.wsum.begin() + ct * d, 0.0f);
  }
  for (int64_t blk = blocks - 1; blk >= 0; --blk) {
    const int64_t s0 = blk * L, rows = std::min(L, n - s0);
    load_block(p, C, table, b, h, s0, rows, ws.block_n.data() + blk * c, bp.dy, bp.dy_strides, ws);
    float* P = ws.a.data();
    const float* delta = ws.delta.data() + s0;
    for (int64_t i = 0; i < rows; ++i) {
      const float den = ws.den[s0 + i];
      const float inv = den > 0.0f ? 1.0f / den : 0.0f;
      for (int64_t s = 0; s < c; ++s) P[i * c + s] *= inv;
    }
    tril_product(P, rows, c, ws);  // A
    d_matrix(rows, dv, delta, ws);
    float* dvo = bp.dv + (bh * n + s0) * dv;
    float* dk = bp.dk + (bh * n + s0) * d;
    gemm(false, false, rows, dv, c, 1.0f, ws.pk.data(), c, ws.U.data(), dv, 0.0f, dvo, dv);
    gemm(true, false, rows, dv, rows, 1.0f, ws.S.data(), rows, ws.dyt.data(), dv, 1.0f, dvo, dv);
    if (hard) {
      straight_through_dk(ws.T.data(), ws.wsum.data(), ws.routes.moment_codes_of(ws.z.data(), rows),
                          ws.vt.data(), rows, d, dv, scale, dk);
      for (int64_t i = 0; i < rows * rows; ++i) ws.S[i] *= ws.D[i];
      gemm(true, false, rows, d, rows, scale, ws.S.data(), rows, ws.qt.data(), d, 1.0f, dk, d);
    } else {
      float* dp = ws.g.data();
      gemm(false, true, rows, c, dv, 1.0f, ws.vt.data(), dv, ws.U.data(), dv, 0.0f, dp, c);
      for (int64_t j = 0; j < rows; ++j)
        for (int64_t s = 0; s < c; ++s) dp[j * c + s] -= ws.r[s];
      gemm(true, false, rows, c, rows, 1.0f, ws.D.data(), rows, P, c, 1.0f, dp, c);
      soft_assign_backward(ws.pk.data(), dp, ws.kt.data(), rows, C, c, d, p.tau, dk, dC,
                           ws.colsum.data());
    }
    gemm(true, false, c, dv, rows, 1.0f, P, c, ws.dyt.data(), dv, 1.0f, ws.U.data(), dv);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t s = 0; s < c; ++s) ws.r[s] += P[i * c + s] * delta[i];
    if (hard) {
      ws.routes.accumulate(P, ws.qt.data(), ws.dyt.data(), delta, rows, ws.routes.direct_before(s0),
                           scale);
      if (ct > 0)
        add_code_moments(ws.routes.moment_columns(P, rows), ws.qt.data(), ws.dyt.data(), delta,
                         rows, ct, d, dv, ws.T.data(), ws.wsum.data(), ws.x.data());
    }
  }
  if (hard) ws.routes.scatter(bp.dk + bh * n * d);
  // Sequence parallel: the suffix states of this call's queries.
  if (bp.code_sums_out) save_code_sums(p, ws, bp.code_sums_out + bh * vq_code_sums_size(p));
}

}  // namespace

void vq_backward_causal(const VQBackwardParams& bp, const Config& config) {
  const VQParams& p = bp.fwd;
  const std::vector<CodeTable> tables = all_code_tables(p);
  const int64_t L = std::min(p.block, std::max<int64_t>(p.base.nq, 1));
  vq_backward_over_heads<Workspace>(
      bp, config.threads,
      [&](int64_t bh, Workspace& ws, float* dC) { run_head(bp, tables, bh, ws, dC); }, p.codes,
      p.base.d, p.base.dv, p.tau == 0.0f, L, p.base.nq, bp.code_sums_out != nullptr);
}

}  // namespace favor::cpu
