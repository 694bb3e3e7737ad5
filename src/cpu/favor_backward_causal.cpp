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
//
// The decay's gradient (rate = -log gamma) comes from sweep A in pair form,
//   dL/drate = -sum_i gx_i . sum_{j <= i} (i - j) A_ij [v_j | 1],
// with a second, distance-weighted state Dx = sum_{j < c} (c - j) phi(k_j) [v_j | 1]^T
// (origin c: the chunk's first position; same max as [S | s]), so that for query i of chunk c
// the earlier keys give phi(q_i) [(i - c) [S | s] + Dx] and the chunk's own keys
// sum_j (i - j) G_ij [v_j | 1]. Each row's terms combine into dy_i . sum_j (i - j) A_ij
// (v_j - y_i) / den_i: nothing cancels across rows (docs/gradients.md).
//
// Positive family: query i's features are stabilised against its prefix normaliser,
// phi_if <= 1 / P_if, which may be near 1 / FLT_MIN where the prefix key sum is tiny, so R and
// D^T phi(Q_c) could overflow float (dk was NaN). Sweep B keeps R' = sigma R with
// sigma_f = max(s_f, FLT_MIN) of the normaliser s at the chunk's end, and gives the feature
// backward of key j the pair (phi_jf / P*_jf, P*_jf dphi_jf), P*_jf = max(P_jf, FLT_MIN): the
// products are the same, and every factor is at most 1 or a sum of |gx| (the bound and its
// proof: docs/numerics.md, "Causal backward").
#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

#include "cpu/attention_params.hpp"
#include "cpu/blas.hpp"
#include "cpu/causal_chunk.hpp"
#include "cpu/feature_grad.hpp"
#include "cpu/feature_tile.hpp"
#include "cpu/head_state.hpp"
#include "cpu/schedule.hpp"
#include "cpu/vec_math.hpp"

namespace favor::cpu {
namespace {

struct Workspace {
  ChunkWorkspace chunk;
  std::vector<float> phiq, gscaled, dmat, dphi, pa, dx, dvv, R;
  std::vector<float> kscaled, inner, sigma, inv_sigma;  // sweep B: C x F, C x F, F, F
  std::vector<float> gstore, chunk_s;                   // per head: N x (dv + 1); (chunks + 1) x F
  std::vector<double> chunk_max;                        // per head: chunks
  std::vector<float> dist, dist_rows;  // decay only: Dx (F x (dv + 1)); C x (dv + 1) scratch
  // Sized for a whole head of n tokens here, before the parallel region (allocation failures
  // then throw to the caller).
  Workspace(int64_t d, int64_t m, int64_t F, int64_t dv, int64_t n, bool decay)
      : chunk(d, m, F, dv),
        phiq(kChunk * F),
        gscaled(kChunk * (dv + 1)),
        dmat(kChunk * kChunk),
        dphi(kChunk * F),
        pa(kChunk * m),
        dx(kChunk * d),
        dvv(kChunk * dv),
        R(F * (dv + 1)),
        kscaled(kChunk * F),
        inner(kChunk * F),
        sigma(F),
        inv_sigma(F),
        gstore(n * (dv + 1)),
        chunk_s(((n + kChunk - 1) / kChunk + 1) * F),
        chunk_max((n + kChunk - 1) / kChunk),
        dist(decay ? F * (dv + 1) : 0),
        dist_rows(decay ? kChunk * (dv + 1) : 0) {}
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

// gscaled = gx rows times exp(from - M_i) (w.gscaled: also their transposes, and [V | 1]^T).
void scale_rows(const float* gx, int64_t rows, int64_t ldv, double from,
                const std::vector<double>& run_max, float* out) {
  for (int64_t i = 0; i < rows; ++i) {
    const float f = rescale(from, run_max[i]);
    for (int64_t x = 0; x < ldv; ++x) out[i * ldv + x] = f * gx[i * ldv + x];
  }
}

// The same, transposed: out (ldv x rows) = scale_rows(...)^T.
void scale_rows_transposed(const float* gx, int64_t rows, int64_t ldv, double from,
                           const std::vector<double>& run_max, float* out) {
  for (int64_t i = 0; i < rows; ++i) {
    const float f = rescale(from, run_max[i]);
    for (int64_t x = 0; x < ldv; ++x) out[x * rows + i] = f * gx[i * ldv + x];
  }
}

// dphi (rows x F) = A X^T for A (rows x ldv) given transposed, at (ldv x rows), and X (F x ldv):
// with A^T stored the BLAS takes its small-matrix path (no packing of X), 102 against 75
// GFLOP/s for rows = 32, F = 256, ldv = 65 (one thread).
void rows_times_transposed(const float* a_t, int64_t rows, const float* x, int64_t F, int64_t ldv,
                           float* dphi) {
  gemm(true, true, rows, F, ldv, 1.0f, a_t, rows, x, ldv, 0.0f, dphi, F);
}

// The chunk's share of dL/drate, -sum_i gx_i . T_i over its queries (rows r = i - c):
//   T_i = r phi(q_i) [S | s] + phi(q_i) Dx + sum_{j <= i} (r - r_j) G_ij [v_j | 1],
// phi(q_i) as chunk_output scaled it (state read at exp(M_{<c} - M_i)), G at exp(M_j - M_i).
// Uses w.dmat as scratch (chunk_d_matrix overwrites it).
double chunk_rate_grad(int64_t rows, const HeadState& state, const float* gx, const float* vx,
                       Workspace& w) {
  const ChunkWorkspace& ws = w.chunk;
  const int64_t F = ws.F, ldv = ws.dv + 1, ldq = ws.ldq();
  float* t = w.dist_rows.data();
  gemm(false, false, rows, ldv, F, 1.0f, ws.qg.data(), ldq, state.Sx, ldv, 0.0f, t, ldv);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t x = 0; x < ldv; ++x) t[i * ldv + x] *= static_cast<float>(i);
  }
  gemm(false, false, rows, ldv, F, 1.0f, ws.qg.data(), ldq, w.dist.data(), ldv, 1.0f, t, ldv);
  const float* G = ws.qg.data() + F;
  for (int64_t i = 0; i < rows; ++i) {
    float* wi = w.dmat.data() + i * kChunk;
    for (int64_t j = 0; j < i; ++j) wi[j] = static_cast<float>(i - j) * G[i * ldq + j];
    std::fill(wi + i, wi + rows, 0.0f);
  }
  gemm(false, false, rows, ldv, rows, 1.0f, w.dmat.data(), kChunk, vx, ldv, 1.0f, t, ldv);
  double sum = 0.0;
  for (int64_t i = 0; i < rows * ldv; ++i) sum += static_cast<double>(gx[i]) * t[i];
  return -sum;
}

// chunk_state_update and, with `distance`, Dx's origin moved past the chunk (c -> c + rows):
// Dx + rows [S | s] (both at the old max), rescaled as the state is (exp(old max - new max)),
// plus the chunk's keys at distance rows - r (ws.phik, then at the chunk's last running max).
void update_states(int64_t rows, bool moved, bool distance, HeadState& state, const float* vx,
                   Workspace& w) {
  ChunkWorkspace& ws = w.chunk;
  if (!distance) {
    chunk_state_update(rows, moved, state, vx, ws);
    return;
  }
  const int64_t F = ws.F, ldv = ws.dv + 1;
  const auto shift = static_cast<float>(rows);
  for (size_t k = 0; k < w.dist.size(); ++k) w.dist[k] += shift * state.Sx[k];
  const double old_max = state.max;
  chunk_state_update(rows, moved, state, vx, ws);
  const float f = rescale(old_max, state.max);
  if (f != 1.0f) {
    for (float& x : w.dist) x *= f;
  }
  float* wv = w.dist_rows.data();
  for (int64_t r = 0; r < rows; ++r) {
    const auto weight = static_cast<float>(rows - r);
    for (int64_t x = 0; x < ldv; ++x) wv[r * ldv + x] = weight * vx[r * ldv + x];
  }
  gemm(true, false, F, ldv, rows, 1.0f, ws.phik.data(), F, wv, ldv, 1.0f, w.dist.data(), ldv);
}

// The upstream gradient of a chunk of head bh: [dy / den, -(dy . y) / den], or, for a part of
// hybrid attention (bp.merged_lse), exp(c_i + M_i - lse_i) [dy, -dy . y] with the merged y.
void chunk_upstream(const BackwardParams& bp, int64_t bh, int64_t c0, int64_t rows,
                    const float* dyh, const ChunkWorkspace& ws, float* gx) {
  const AttentionParams& p = bp.fwd;
  const int64_t dv = p.dv, ldv = dv + 1;
  if (bp.merged_lse == nullptr) {
    upstream_rows(ws.yx.data(), dyh + c0 * bp.dy_strides[2], bp.dy_strides[2], bp.dy_strides[3],
                  rows, dv, gx);
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = bh * bp.grad_rows() + c0 + r;
    const double shift = ws.qshift[r] + ws.run_max[r], lse = bp.merged_lse[i];
    float* g = gx + r * ldv;
    if (std::isinf(shift) || std::isinf(lse)) {
      std::fill(g, g + ldv, 0.0f);
      continue;
    }
    const auto f = static_cast<float>(std::exp(shift - lse));
    const float* dy = dyh + (c0 + r) * bp.dy_strides[2];
    const float* y = bp.merged_y + i * dv;
    float dot = 0.0f;
    for (int64_t x = 0; x < dv; ++x) {
      const float d = dy[x * bp.dy_strides[3]];
      g[x] = f * d;
      dot += d * y[x];
    }
    g[dv] = -f * dot;
  }
}

// Where a head's sweep A leaves what sweep B reads: gx (N x (dv + 1)), each chunk's starting
// normaliser and the final one ((chunks + 1) x F) and each chunk's starting max (chunks).
struct HeadStore {
  float* gx;
  float* chunk_s;
  double* chunk_max;
};

// A. Forward sweep from the initial state (fwd.init_states; empty without): outputs, gx, dq
// (and drate). With r_out, also R of all the slice's queries relative to the initial max.
void sweep_a(const BackwardParams& bp, int64_t b, int64_t h, Workspace& w, const HeadStore& st,
             float* r_out) {
  const AttentionParams& p = bp.fwd;
  ChunkWorkspace& ws = w.chunk;
  const int64_t F = ws.F, d = p.d, ldv = p.dv + 1, ldq = ws.ldq(), n = p.nq;
  const int64_t chunks = (n + kChunk - 1) / kChunk, bh = b * p.heads + h;
  float* dw = bp.head_dw(bh);
  float* db = bp.head_dbias(bh);
  const float* dyh = bp.dy + b * bp.dy_strides[0] + h * bp.dy_strides[1];
  float* vx = ws.sv.data() + F * ldv;
  double* drate = bp.drate ? bp.drate + bh : nullptr;

  HeadState state = ws.state();
  state.clear();
  std::fill(w.dist.begin(), w.dist.end(), 0.0f);
  if (p.init_states) {  // the earlier ranks' keys
    std::copy_n(p.init_states + bh * F * ldv, F * ldv, state.Sx);
    state.max = p.init_maxima[bh];
    if (drate && p.init_distance)
      std::copy_n(p.init_distance + bh * F * ldv, F * ldv, w.dist.data());
  }
  const double start_max = state.max;
  double rate_sum = 0.0;
  ws.forget_block();
  for (int64_t ci = 0; ci < chunks; ++ci) {
    const int64_t c0 = ci * kChunk, rows = std::min(kChunk, n - c0);
    if (!block_holds(ws, bh, c0, rows))
      load_block(p, b, h, c0, std::min(n, c0 + kProjectBlock), ws);  // the chunks ahead
    load_chunk(p, b, h, c0, rows, vx, ws);
    const bool moved = chunk_key_features(p, rows, state.max, ws);
    state.copy_normaliser(st.chunk_s + ci * F);
    st.chunk_max[ci] = state.max;
    chunk_query_features(p, rows, st.chunk_s + ci * F, state.max, ws);
    for (int64_t i = 0; i < rows; ++i)
      std::copy_n(ws.qg.data() + i * ldq, F, w.phiq.data() + i * F);
    chunk_kernel_matrix(rows, moved, ws);
    chunk_output(rows, state.max, moved, ws);
    float* gx = st.gx + c0 * ldv;
    chunk_upstream(bp, bh, c0, rows, dyh, ws, gx);
    if (drate) rate_sum += chunk_rate_grad(rows, state, gx, vx, w);
    if (r_out && !std::isinf(start_max)) {  // R += phi(Q_c)^T gx at exp(start - M_i)
      scale_rows(gx, rows, ldv, start_max, ws.run_max, w.gscaled.data());
      gemm(true, false, F, ldv, rows, 1.0f, w.phiq.data(), F, w.gscaled.data(), ldv, 1.0f, r_out,
           ldv);
    }
    scale_rows_transposed(gx, rows, ldv, state.max, ws.run_max, w.gscaled.data());
    rows_times_transposed(w.gscaled.data(), rows, state.Sx, F, ldv, w.dphi.data());
    chunk_d_matrix(rows, moved, gx, vx, ldv, w);
    gemm(false, false, rows, F, rows, 1.0f, w.dmat.data(), kChunk, ws.phik.data(), F, 1.0f,
         w.dphi.data(), F);
    feature_backward(p.map, bh, nullptr, rows, ws.xq, w.phiq.data(), w.dphi.data(), w.pa.data(),
                     bp.dq + (bh * bp.grad_rows() + c0) * d, dw, db);
    update_states(rows, moved, drate && ci + 1 < chunks, state, vx, w);
  }
  state.copy_normaliser(st.chunk_s + chunks * F);
  if (drate) *drate += rate_sum;
}

// sigma_f = max(s_f, FLT_MIN) of a normaliser s (positive family; else 1) and 1 / sigma.
void floor_normaliser(const float* s, bool scaled, int64_t F, float* sigma, float* inv) {
  for (int64_t f = 0; f < F; ++f) {
    sigma[f] = scaled ? std::max(s[f], FLT_MIN) : 1.0f;
    inv[f] = 1.0f / sigma[f];
  }
}

// P*_jf = max(P_jf, FLT_MIN): key j's prefix normaliser (itself included), floored.
float floored_prefix(const ChunkWorkspace& ws, bool scaled, int64_t j, int64_t f) {
  return scaled ? std::max(ws.prefix[j * ws.F + f], FLT_MIN) : 1.0f;
}

// dphi += P* (D^T phi(Q_c)): the chunk's own later queries, read by key j (P* = 1 outside the
// positive family). Each term (D_ij P*_jf) phi_if is at most |D_ij| in magnitude
// (P*_jf exp(M_j - M_i) <= max(P_if, FLT_MIN) <= 1 / phi_if), but D^T phi(Q_c) alone is not
// bounded (phi_if up to 1 / FLT_MIN): the GEMM forms it only where rows max|D| max phi stays
// below FLT_MAX / 2, else the terms are summed in that order.
void add_chunk_queries(int64_t rows, bool scaled, Workspace& w) {
  ChunkWorkspace& ws = w.chunk;
  const int64_t F = ws.F, ldq = ws.ldq();
  const float* D = w.dmat.data();
  float max_d = 0.0f, max_phi = 0.0f;
  for (int64_t i = 0; scaled && i < rows; ++i) {
    for (int64_t j = 0; j <= i; ++j) max_d = std::max(max_d, std::abs(D[i * kChunk + j]));
    max_phi = std::max(max_phi, max_value(ws.qg.data() + i * ldq, F));
  }
  if (!scaled) {
    gemm(true, false, rows, F, rows, 1.0f, D, kChunk, ws.qg.data(), ldq, 1.0f, w.dphi.data(), F);
    return;
  }
  float* inner = w.inner.data();
  if (static_cast<double>(rows) * max_d * max_phi < 0.5 * FLT_MAX) {
    gemm(true, false, rows, F, rows, 1.0f, D, kChunk, ws.qg.data(), ldq, 0.0f, inner, F);
    add_floored_product(ws.prefix.data(), inner, w.dphi.data(), rows * F);
    return;
  }
  for (int64_t j = 0; j < rows; ++j) {
    float* out = w.dphi.data() + j * F;
    for (int64_t i = j; i < rows; ++i) {
      const float dij = D[i * kChunk + j];
      const float* phi = ws.qg.data() + i * ldq;
      for (int64_t f = 0; dij != 0.0f && f < F; ++f)
        out[f] += (dij * floored_prefix(ws, true, j, f)) * phi[f];
    }
  }
}

// A head's part of a causal context (save_causal_states): the state before each chunk
// ((chunks + 1) x F x (dv + 1)) and each row's [num | den] (N x (dv + 1)).
struct SavedForward {
  const float* states;
  const float* rows;
};

// Sweep A's work on one chunk, from a saved forward: gx from the saved [num | den], then
// dphi(Q_c) = gx [S | s]_{<c}^T (rows at exp(M_{<c} - M_i)) + D phi(K_c) -> dq. Leaves D in
// w.dmat and gx in `gx`.
void saved_query_chunk(const BackwardParams& bp, int64_t bh, int64_t c0, int64_t rows, bool moved,
                       const float* state, double state_max, const float* saved_rows,
                       const float* vx, float* gx, Workspace& w) {
  const AttentionParams& p = bp.fwd;
  ChunkWorkspace& ws = w.chunk;
  const int64_t F = ws.F, ldv = p.dv + 1, d = p.d;
  const float* dyh = bp.dy + (bh / p.heads) * bp.dy_strides[0] + (bh % p.heads) * bp.dy_strides[1];
  if (bp.merged_lse) {  // a part of hybrid attention: the merged rows (saved_rows unread)
    chunk_upstream(bp, bh, c0, rows, dyh, ws, gx);
  } else {
    upstream_rows(saved_rows, dyh + c0 * bp.dy_strides[2], bp.dy_strides[2], bp.dy_strides[3], rows,
                  p.dv, gx);
  }
  for (int64_t i = 0; i < rows; ++i)
    std::copy_n(ws.qg.data() + i * ws.ldq(), F, w.phiq.data() + i * F);
  scale_rows_transposed(gx, rows, ldv, state_max, ws.run_max, w.gscaled.data());
  rows_times_transposed(w.gscaled.data(), rows, state, F, ldv, w.dphi.data());
  chunk_d_matrix(rows, moved, gx, vx, ldv, w);
  gemm(false, false, rows, F, rows, 1.0f, w.dmat.data(), kChunk, ws.phik.data(), F, 1.0f,
       w.dphi.data(), F);
  feature_backward(p.map, bh, nullptr, rows, ws.xq, w.phiq.data(), w.dphi.data(), w.pa.data(),
                   bp.dq + (bh * bp.grad_rows() + c0) * d, bp.head_dw(bh), bp.head_dbias(bh));
}

// B. Reverse sweep: dk, dv, with R = later queries' phi(q) gx^T, starting from suffix_r (the
// later ranks' queries, relative to exp(suffix_ref); null: none). R is held as R' = sigma R
// (positive family; sigma = 1 otherwise), sigma of the normaliser after the current chunk.
// With `saved` (a causal context) it also does sweep A's work on each chunk (gx, dq) and
// reads each chunk's starting normaliser from its saved state.
void sweep_b(const BackwardParams& bp, int64_t b, int64_t h, Workspace& w, const HeadStore& st,
             const float* suffix_r, double suffix_ref, const SavedForward* saved = nullptr) {
  const AttentionParams& p = bp.fwd;
  ChunkWorkspace& ws = w.chunk;
  const int64_t F = ws.F, m = p.map.m, dv = p.dv, ldv = dv + 1, n = p.nq;
  const int64_t chunks = (n + kChunk - 1) / kChunk, bh = b * p.heads + h;
  const bool scaled = positive_family(p.map.kernel);
  float* dw = bp.head_dw(bh);
  float* db = bp.head_dbias(bh);
  float* vx = ws.sv.data() + F * ldv;
  float* sigma = w.sigma.data();
  float* inv_sigma = w.inv_sigma.data();
  std::fill(w.R.begin(), w.R.end(), 0.0f);
  ws.forget_block();
  for (int64_t ci = chunks - 1; ci >= 0; --ci) {
    const int64_t c0 = ci * kChunk, rows = std::min(kChunk, n - c0);
    const double prev_max = st.chunk_max[ci];
    if (saved) {  // the chunk's starting normaliser; the state before the chunk ahead to L2
      const float* state = saved->states + ci * F * ldv;
      for (int64_t f = 0; f < F; ++f) st.chunk_s[ci * F + f] = state[f * ldv + dv];
      if (ci > 0) {
        constexpr int64_t kLine = 64 / sizeof(float);
        for (int64_t x = 0; x < F * ldv; x += kLine) __builtin_prefetch(state - F * ldv + x, 0, 1);
      }
    }
    if (!block_holds(ws, bh, c0, rows))  // the chunks behind, this one last
      load_block(p, b, h, std::max<int64_t>(0, c0 + kChunk - kProjectBlock), c0 + rows, ws);
    load_chunk(p, b, h, c0, rows, vx, ws);
    const bool moved = chunk_key_features(p, rows, prev_max, ws);
    chunk_query_features(p, rows, st.chunk_s + ci * F, prev_max, ws);
    chunk_kernel_matrix(rows, moved, ws);
    const float* gx = st.gx + c0 * ldv;
    if (saved) {
      saved_query_chunk(bp, bh, c0, rows, moved, saved->states + ci * F * ldv, prev_max,
                        saved->rows + c0 * ldv, vx, st.gx + c0 * ldv, w);
    } else {
      chunk_d_matrix(rows, moved, gx, vx, ldv, w);
    }
    const double end_max = ws.run_max[rows - 1];
    floor_normaliser(st.chunk_s + (ci + 1) * F, scaled, F, sigma, inv_sigma);
    if (ci == chunks - 1 && suffix_r && !std::isinf(suffix_ref) && !std::isinf(end_max)) {
      const auto e = static_cast<float>(std::exp(suffix_ref - end_max));  // ~1: the same max
      for (int64_t f = 0; f < F; ++f)
        for (int64_t x = 0; x < ldv; ++x) w.R[f * ldv + x] = e * sigma[f] * suffix_r[f * ldv + x];
    }
    // Later chunks, read by key j at scale e_j = exp(M_j - M_end): dphi_jf = rho_jf ([V | 1]
    // R'^T)_jf with rho_jf = (P*_jf e_j) / sigma_f <= 1, and dV_j = sum_f kscaled_jf R'_f with
    // kscaled_jf = (phi_jf e_j) / sigma_f <= 1. Key j's features become phi_jf / P*_jf <= 1.
    for (int64_t j = 0; j < rows; ++j)
      for (int64_t x = 0; x < ldv; ++x) w.gscaled[x * rows + j] = vx[j * ldv + x];  // [V | 1]^T
    rows_times_transposed(w.gscaled.data(), rows, w.R.data(), F, ldv, w.dphi.data());
    for (int64_t j = 0; j < rows; ++j) {
      key_row_scales(scaled ? ws.prefix.data() + j * F : nullptr, rescale(ws.run_max[j], end_max),
                     inv_sigma, w.dphi.data() + j * F, ws.phik.data() + j * F,
                     w.kscaled.data() + j * F, F);
    }
    gemm(false, false, rows, dv, F, 1.0f, w.kscaled.data(), F, w.R.data(), ldv, 0.0f, w.dvv.data(),
         dv);
    // The chunk itself: P* D^T phi(Q_c) and G^T gx[:, :dv].
    add_chunk_queries(rows, scaled, w);
    gemm(true, false, rows, dv, rows, 1.0f, ws.qg.data() + F, ws.ldq(), gx, ldv, 1.0f, w.dvv.data(),
         dv);
    const KeyRows keys{bp.dlogw ? bp.dlogw + bh * m : nullptr};
    feature_backward(p.map, bh, &keys, rows, ws.xk, ws.phik.data(), w.dphi.data(), w.pa.data(),
                     bp.dk + (bh * bp.grad_rows() + c0) * p.d, dw, db);
    std::copy_n(w.dvv.data(), rows * dv, bp.dv + (bh * bp.grad_rows() + c0) * dv);
    if (ci > 0) {
      // R' relative to the previous chunk's end (max prev_max, sigma' of chunk_s[ci]): times
      // (sigma'_f exp(prev - end)) / sigma_f <= 1, plus the chunk's queries with the weights
      // phi_if (sigma'_f exp(prev - M_i)) <= 1.
      const float e_end = rescale(prev_max, end_max);
      for (int64_t f = 0; f < F; ++f) {
        const float next = scaled ? std::max(st.chunk_s[ci * F + f], FLT_MIN) : 1.0f;
        const float ratio = (next * e_end) * inv_sigma[f];
        scale_copy(w.R.data() + f * ldv, ratio, w.R.data() + f * ldv, ldv);
        sigma[f] = next;
      }
      for (int64_t i = 0; i < rows; ++i) {
        mul_scaled(ws.qg.data() + i * ws.ldq(), sigma, rescale(prev_max, ws.run_max[i]),
                   w.kscaled.data() + i * F, F);
      }
      gemm(true, false, F, ldv, rows, 1.0f, w.kscaled.data(), F, gx, ldv, 1.0f, w.R.data(), ldv);
    }
  }
}

void run_head(const BackwardParams& bp, int64_t b, int64_t h, Workspace& w) {
  const HeadStore st{w.gstore.data(), w.chunk_s.data(), w.chunk_max.data()};
  sweep_a(bp, b, h, w, st, nullptr);
  sweep_b(bp, b, h, w, st, nullptr, 0.0);
}

// One reverse sweep over a causal context: the chunk normalisers and maxima come from the
// saved states, gx and dq from saved_query_chunk.
void run_head_saved(const BackwardParams& bp, int64_t b, int64_t h, Workspace& w) {
  const AttentionParams& p = bp.fwd;
  const int64_t F = p.map.features(), ldv = p.dv + 1, chunks = kernels::causal_chunks(p.nq);
  const int64_t bh = b * p.heads + h;
  const float* states = bp.ctx_chunk_states + bh * (chunks + 1) * F * ldv;
  // The normalisers: the final one here, each chunk's starting one as sweep_b reaches its
  // state (a pass over every state here cost a read of the whole context).
  for (int64_t f = 0; f < F; ++f) w.chunk_s[chunks * F + f] = states[(chunks * F + f) * ldv + p.dv];
  for (int64_t c = 0; c < chunks; ++c) w.chunk_max[c] = bp.ctx_chunk_maxima[bh * (chunks + 1) + c];
  const SavedForward saved{states, bp.ctx_rows + bh * p.nq * ldv};
  const HeadStore st{w.gstore.data(), w.chunk_s.data(), w.chunk_max.data()};
  sweep_b(bp, b, h, w, st, nullptr, 0.0, &saved);
}

HeadStore store_of(const BackwardParams& bp, CausalBackwardStore& store, int64_t bh) {
  const AttentionParams& p = bp.fwd;
  const int64_t chunks = (p.nq + kChunk - 1) / kChunk, F = p.map.features();
  return {store.gx.data() + bh * p.nq * (p.dv + 1), store.chunk_s.data() + bh * (chunks + 1) * F,
          store.chunk_max.data() + bh * chunks};
}

}  // namespace

void favor_backward_causal(const BackwardParams& bp, const Config& config) {
  const AttentionParams& p = bp.fwd;
  backward_over_heads<Workspace>(
      p.batch * p.heads, config.threads,
      [&](int64_t bh, Workspace& ws) {
        // The decay's gradient needs sweep A's distance state: it recomputes.
        if (bp.ctx_chunk_states && bp.drate == nullptr) {
          run_head_saved(bp, bh / p.heads, bh % p.heads, ws);
        } else {
          run_head(bp, bh / p.heads, bh % p.heads, ws);
        }
      },
      p.d, p.map.m, p.map.features(), p.dv, p.nq, bp.drate != nullptr);
}

void CausalBackwardStore::reserve(int64_t heads, int64_t n, int64_t features, int64_t dv) {
  const int64_t chunks = (n + kChunk - 1) / kChunk, ld = dv + 1;
  gx.assign(static_cast<size_t>(heads * n * ld), 0.0f);
  chunk_s.assign(static_cast<size_t>(heads * (chunks + 1) * features), 0.0f);
  chunk_max.assign(static_cast<size_t>(heads * chunks), 0.0);
  r.assign(static_cast<size_t>(heads * features * ld), 0.0f);
  r_max.assign(static_cast<size_t>(heads), -INFINITY);
}

void favor_backward_causal_phase_a(const BackwardParams& bp, const Config& config,
                                   CausalBackwardStore& store) {
  const AttentionParams& p = bp.fwd;
  const int64_t heads = p.batch * p.heads, F = p.map.features(), ld = p.dv + 1;
  store.reserve(heads, p.nq, F, p.dv);
  for (int64_t bh = 0; bh < heads; ++bh) {
    if (p.init_maxima) store.r_max[bh] = p.init_maxima[bh];
  }
  if (p.nq == 0) return;
  backward_over_heads<Workspace>(
      heads, config.threads,
      [&](int64_t bh, Workspace& ws) {
        sweep_a(bp, bh / p.heads, bh % p.heads, ws, store_of(bp, store, bh),
                store.r.data() + bh * F * ld);
      },
      p.d, p.map.m, F, p.dv, int64_t{0}, bp.drate != nullptr);
}

void favor_backward_causal_phase_b(const BackwardParams& bp, const Config& config,
                                   CausalBackwardStore& store, const float* suffix_r,
                                   const double* suffix_ref) {
  const AttentionParams& p = bp.fwd;
  const int64_t F = p.map.features(), ld = p.dv + 1;
  if (p.nq == 0) return;
  backward_over_heads<Workspace>(
      p.batch * p.heads, config.threads,
      [&](int64_t bh, Workspace& ws) {
        sweep_b(bp, bh / p.heads, bh % p.heads, ws, store_of(bp, store, bh), suffix_r + bh * F * ld,
                suffix_ref[bh]);
      },
      p.d, p.map.m, F, p.dv, int64_t{0}, false);
}

}  // namespace favor::cpu
