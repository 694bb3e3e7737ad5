// Backward pass of causal FAVOR attention, per (batch, head), in two chunk sweeps that
// recompute what they need (memory O(N (Dv + 1) + (N / C) F + F Dv) per head):
//   A. forward, chunk by chunk, exactly as the forward pass (cpu/causal_chunk.hpp):
//      [num | den], the upstream gradient gx = [dy / den, -(dy . y) / den] (stored: N rows),
//      and dphi(Q_c) = gx [S | s]_{<c}^T (rows at scale exp(M_{<c} - M_i)) + D phi(K_c) with
//      D = tril(gx [V_c | 1]^T) at scale exp(M_j - M_i) -> dq. Each chunk's starting
//      normaliser and max are stored (F + 1 per chunk) for sweep B.
//   B. reverse: R = sum over later queries phi(q_i) gx_i^T (relative to the chunk's last
//      running max), dphi(K_c) = [V_c | 1] R^T + D^T phi(Q_c), dV_c = phi(K_c) R[:, :Dv] +
//      G^T gx[:, :Dv] -> dk, dv; then R takes in the chunk's queries.
// As in the forward pass all scale factors are exp(M_j - M_i) <= 1 for j <= i.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/attention_params.hpp"
#include "cpu/blas.hpp"
#include "cpu/causal_chunk.hpp"
#include "cpu/feature_grad.hpp"
#include "cpu/head_state.hpp"
#include "cpu/schedule.hpp"

namespace favor::cpu {
namespace {

struct Workspace {
  ChunkWorkspace chunk;
  std::vector<float> phiq, gscaled, dmat, dphi, pa, dx, dvv, R, dw, db;
  std::vector<float> gstore, chunk_s;  // per head: N x (dv + 1); chunks x F
  std::vector<double> chunk_max;       // per head: chunks
  // Sized for a whole head of n tokens here, before the parallel region (allocation failures
  // then throw to the caller).
  Workspace(int64_t d, int64_t m, int64_t F, int64_t dv, bool summed_dw, bool summed_db, int64_t n)
      : chunk(d, m, F, dv),
        phiq(kChunk * F),
        gscaled(kChunk * (dv + 1)),
        dmat(kChunk * kChunk),
        dphi(kChunk * F),
        pa(kChunk * m),
        dx(kChunk * d),
        dvv(kChunk * dv),
        R(F * (dv + 1)),
        dw(summed_dw ? m * d : 0),
        db(summed_db ? m : 0),
        gstore(n * (dv + 1)),
        chunk_s((n + kChunk - 1) / kChunk * F),
        chunk_max((n + kChunk - 1) / kChunk) {}
};

// D = tril(gx [V_c | 1]^T), D_ij at scale exp(M_j - M_i).
void chunk_d_matrix(int64_t rows, bool moved, const float* gx, const float* vx, int64_t ldv,
                    Workspace& w) {
  const ChunkWorkspace& ws = w.chunk;
  gemm(false, true, rows, rows, ldv, 1.0f, gx, ldv, vx, ldv, 0.0f, w.dmat.data(), kChunk);
  for (int64_t i = 0; i < rows; ++i) {
    float* di = w.dmat.data() + i * kChunk;
    std::fill(di + i + 1, di + rows, 0.0f);
    if (moved) {
      for (int64_t j = 0; j <= i; ++j) di[j] *= rescale(ws.run_max[j], ws.run_max[i]);
    }
  }
}

// gscaled = gx rows times exp(from - M_i).
void scale_rows(const float* gx, int64_t rows, int64_t ldv, double from,
                const std::vector<double>& run_max, float* out) {
  for (int64_t i = 0; i < rows; ++i) {
    const float f = rescale(from, run_max[i]);
    for (int64_t x = 0; x < ldv; ++x) out[i * ldv + x] = f * gx[i * ldv + x];
  }
}

void run_head(const BackwardParams& bp, int64_t b, int64_t h, Workspace& w) {
  const AttentionParams& p = bp.fwd;
  ChunkWorkspace& ws = w.chunk;
  const int64_t F = ws.F, d = p.d, m = p.map.m, dv = p.dv, ldv = dv + 1, ldq = ws.ldq(), n = p.nq;
  const int64_t chunks = (n + kChunk - 1) / kChunk, bh = b * p.heads + h;
  float* dw = bp.head_dw(bh, w.dw.empty() ? nullptr : w.dw.data());
  float* db = bp.head_dbias(bh, w.db.empty() ? nullptr : w.db.data());
  const float* dyh = bp.dy + b * bp.dy_strides[0] + h * bp.dy_strides[1];
  float* vx = ws.sv.data() + F * ldv;

  // A. Forward sweep: outputs, gx, dq.
  HeadState state = ws.state();
  state.clear();
  for (int64_t ci = 0; ci < chunks; ++ci) {
    const int64_t c0 = ci * kChunk, rows = std::min(kChunk, n - c0);
    load_chunk(p, b, h, c0, rows, vx, ws);
    const bool moved = chunk_key_features(p, rows, state.max, ws);
    state.copy_normaliser(w.chunk_s.data() + ci * F);
    w.chunk_max[ci] = state.max;
    chunk_query_features(p, rows, w.chunk_s.data() + ci * F, state.max, ws);
    for (int64_t i = 0; i < rows; ++i)
      std::copy_n(ws.qg.data() + i * ldq, F, w.phiq.data() + i * F);
    chunk_kernel_matrix(rows, moved, ws);
    chunk_output(rows, state.max, moved, ws);
    float* gx = w.gstore.data() + c0 * ldv;
    upstream_rows(ws.yx.data(), dyh + c0 * bp.dy_strides[2], bp.dy_strides[2], bp.dy_strides[3],
                  rows, dv, gx);
    scale_rows(gx, rows, ldv, state.max, ws.run_max, w.gscaled.data());
    gemm(false, true, rows, F, ldv, 1.0f, w.gscaled.data(), ldv, state.Sx, ldv, 0.0f, w.dphi.data(),
         F);
    chunk_d_matrix(rows, moved, gx, vx, ldv, w);
    gemm(false, false, rows, F, rows, 1.0f, w.dmat.data(), kChunk, ws.phik.data(), F, 1.0f,
         w.dphi.data(), F);
    feature_backward(p.map, bh, nullptr, rows, ws.x.data() + rows * d, w.phiq.data(),
                     w.dphi.data(), w.pa.data(), bp.dq + (bh * n + c0) * d, dw, db);
    chunk_state_update(rows, moved, state, vx, ws);
  }

  // B. Reverse sweep: dk, dv, with R = later queries' phi(q) gx^T.
  std::fill(w.R.begin(), w.R.end(), 0.0f);
  for (int64_t ci = chunks - 1; ci >= 0; --ci) {
    const int64_t c0 = ci * kChunk, rows = std::min(kChunk, n - c0);
    const double prev_max = w.chunk_max[ci];
    load_chunk(p, b, h, c0, rows, vx, ws);
    const bool moved = chunk_key_features(p, rows, prev_max, ws);
    chunk_query_features(p, rows, w.chunk_s.data() + ci * F, prev_max, ws);
    chunk_kernel_matrix(rows, moved, ws);
    const float* gx = w.gstore.data() + c0 * ldv;
    chunk_d_matrix(rows, moved, gx, vx, ldv, w);
    const double end_max = ws.run_max[rows - 1];
    // Later chunks, read by key j at scale exp(M_j - M_end).
    gemm(false, true, rows, F, ldv, 1.0f, vx, ldv, w.R.data(), ldv, 0.0f, w.dphi.data(), F);
    gemm(false, false, rows, dv, F, 1.0f, ws.phik.data(), F, w.R.data(), ldv, 0.0f, w.dvv.data(),
         dv);
    if (moved) {
      for (int64_t j = 0; j < rows; ++j) {
        const float f = rescale(ws.run_max[j], end_max);
        for (int64_t x = 0; x < F; ++x) w.dphi[j * F + x] *= f;
        for (int64_t x = 0; x < dv; ++x) w.dvv[j * dv + x] *= f;
      }
    }
    // The chunk itself: D^T phi(Q_c) and G^T gx[:, :dv].
    gemm(true, false, rows, F, rows, 1.0f, w.dmat.data(), kChunk, ws.qg.data(), ldq, 1.0f,
         w.dphi.data(), F);
    gemm(true, false, rows, dv, rows, 1.0f, ws.qg.data() + F, ldq, gx, ldv, 1.0f, w.dvv.data(), dv);
    // Key j of the chunk sits at position c0 + j (as in chunk_key_features).
    const KeyRows keys{nullptr, c0, 0.5 * static_cast<double>(n - 1),
                       bp.dlogw ? bp.dlogw + bh * m : nullptr, bp.drate ? bp.drate + bh : nullptr};
    feature_backward(p.map, bh, &keys, rows, ws.x.data(), ws.phik.data(), w.dphi.data(),
                     w.pa.data(), bp.dk + (bh * n + c0) * d, dw, db);
    std::copy_n(w.dvv.data(), rows * dv, bp.dv + (bh * n + c0) * dv);
    if (ci > 0) {  // R relative to the previous chunk's last max (= this chunk's starting max)
      const float f = rescale(prev_max, end_max);
      for (float& r : w.R) r *= f;
      scale_rows(gx, rows, ldv, prev_max, ws.run_max, w.gscaled.data());
      gemm(true, false, F, ldv, rows, 1.0f, ws.qg.data(), ldq, w.gscaled.data(), ldv, 1.0f,
           w.R.data(), ldv);
    }
  }
}

}  // namespace

void favor_backward_causal(const BackwardParams& bp) {
  const AttentionParams& p = bp.fwd;
  backward_over_heads<Workspace>(
      p.batch * p.heads, p.threads, bp.dw, bp.dbias,
      [&](int64_t bh, Workspace& ws) { run_head(bp, bh / p.heads, bh % p.heads, ws); }, p.d, p.map.m,
      p.map.features(), p.dv, bp.summed_dw(), bp.summed_dbias(), p.nq);
}

}  // namespace favor::cpu
