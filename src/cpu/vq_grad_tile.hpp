#pragma once
// Pieces shared by the Transformer-VQ backward kernels (vq_backward.cpp, bidirectional, and
// vq_backward_causal.cpp): key weights of a tile, the stabilised query weights of a row, the
// per-code moments that give the straight-through key gradient of hard VQ, and the chain
// rule through the soft assignment.
//
// Notation (per head): logits l_is = scale q_i.C_s; key weights p_j = one-hot(z_j) (hard) or
// p(.|k_j) (soft); a_is = exp(l_is - m_i) with m_i = max_s (l_is + log n_s) over the codes
// with visible weight n_s > 0 (n the per-code sum of the key weights the row sees), so the
// row's denominator over exp(m_i) lies in [1, c]; P_is = a_is / den_i.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu/schedule.hpp"
#include "cpu/vq_assign.hpp"
#include "cpu/vq_params.hpp"

namespace favor::cpu {

/// Rows per tile of the bidirectional backward, and the causal backward's default block:
/// the hard-VQ moment update T += P^T X is a GEMM with K = the tile, which wants K >= 64.
constexpr int64_t kVQGradTile = 128;

/// Key weights pk (rows x c) of the gathered key rows k (rows x d) of keys [start, start +
/// rows) of batch b: one-hot rows with the code in z (hard VQ), or p(.|k) (soft, z unused).
/// Masked keys get zero rows and z = -1.
void key_weights(const VQParams& p, const CodeTable& table, int64_t b, const float* k,
                 int64_t start, int64_t rows, float* pk, int32_t* z);

/// Hard VQ per-code moments: T (c x d*dv) += P^T X with X_i = vec(q_i dy_i^T), and
/// wsum (c x d) += P^T (delta q), for the c codes whose columns P (rows x c) holds (the
/// moment codes of cpu/vq_key_routes.hpp). One GEMM each: O(rows c d dv). scratch:
/// rows x (d dv + d).
void add_code_moments(const float* P, const float* q, const float* dy, const float* delta,
                      int64_t rows, int64_t c, int64_t d, int64_t dv, float* T, float* wsum,
                      float* scratch);

/// Hard VQ straight-through key gradient from the moments of the queries that see the keys:
/// dk_j += scale (T_{z_j} v_j - w_{z_j}) for the keys with z_j >= 0 (z: the moment codes'
/// numbering, -1 for the keys of direct codes). O(rows d dv).
void straight_through_dk(const float* T, const float* wsum, const int32_t* z, const float* v,
                         int64_t rows, int64_t d, int64_t dv, float scale, float* dk);

/// Soft VQ: from dp = dL/dp (rows x c, overwritten), dk += the gradient through
/// log p_js = -|k_j - C_s|^2 / tau - lse_j, and dC += its codebook part (when not null).
/// colsum: c floats of scratch.
void soft_assign_backward(const float* pk, float* dp, const float* k, int64_t rows,
                          const float* codebook, int64_t c, int64_t d, float tau, float* dk,
                          float* dC, float* colsum);

/// Sequence parallel: a head's query-side sums [U | r | T | w] (vq_code_sums_size floats:
/// U c x dv, r c, and for hard VQ with every code on the moment route, T c x d x dv and
/// w c x d) from the backward workspace's U, r, T and wsum into sums, or back.
template <class Workspace>
void save_code_sums(const VQParams& p, const Workspace& ws, float* sums) {
  const int64_t c = p.codes, d = p.base.d, dv = p.base.dv;
  sums = std::copy_n(ws.U.begin(), c * dv, sums);
  sums = std::copy_n(ws.r.begin(), c, sums);
  if (p.tau != 0.0f) return;
  sums = std::copy_n(ws.T.begin(), c * d * dv, sums);
  std::copy_n(ws.wsum.begin(), c * d, sums);
}
template <class Workspace>
void load_code_sums(const VQParams& p, const float* sums, Workspace& ws) {
  const int64_t c = p.codes, d = p.base.d, dv = p.base.dv;
  std::copy_n(sums, c * dv, ws.U.begin());
  std::copy_n(sums + c * dv, c, ws.r.begin());
  if (p.tau != 0.0f) return;
  sums += c * (dv + 1);
  std::copy_n(sums, c * d * dv, ws.T.begin());
  std::copy_n(sums + c * d * dv, c * d, ws.wsum.begin());
}

/// The backward kernels' driver: run_head(bh, workspace, dC) for every (batch, head), heads
/// spread over up to `threads` threads. dC is the head's own slice of dL/dC (null when not asked);
/// the slices are summed into bp.dcodebook afterwards in head order, so the result is the same for
/// any thread count (the price: B H c d floats while the codebook gradient is asked).
template <class Workspace, class RunHead, class... Args>
void vq_backward_over_heads(const VQBackwardParams& bp, int threads, RunHead run_head,
                            const Args&... args) {
  const AttentionParams& a = bp.fwd.base;
  const int64_t heads = a.batch * a.heads, slice = bp.fwd.codes * a.d;
  const Schedule plan = heads_only(heads, threads);
  std::vector<Workspace> spaces = make_workspaces<Workspace>(plan.team, args...);
  std::vector<float> dc(bp.dcodebook ? static_cast<size_t>(heads * slice) : 0);
  for_each_head(plan, spaces, [&](int64_t bh, Workspace& ws) {
    run_head(bh, ws, dc.empty() ? nullptr : dc.data() + bh * slice);
    return int64_t{0};
  });
  for (int64_t bh = 0; bh < heads && bp.dcodebook; ++bh) {
    float* dst = bp.dcodebook + (bh % a.heads) * bp.fwd.codebook_head_stride;
    const float* src = dc.data() + bh * slice;
    for (int64_t i = 0; i < slice; ++i) dst[i] += src[i];
  }
}

}  // namespace favor::cpu
