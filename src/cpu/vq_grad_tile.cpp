#include "cpu/vq_grad_tile.hpp"

#include <algorithm>
#include <cmath>

#include "cpu/blas.hpp"
#include "cpu/vec_math.hpp"
#include "cpu/vq_assign.hpp"

namespace favor::cpu {

void key_weights(const VQParams& p, const CodeTable& table, int64_t b, const float* k,
                 int64_t start, int64_t rows, float* pk, int32_t* z) {
  const int64_t c = p.codes;
  assign_rows(k, rows, table, p.tau, z, pk);
  if (p.tau == 0.0f) {  // one-hot rows
    std::fill(pk, pk + rows * c, 0.0f);
    for (int64_t r = 0; r < rows; ++r) pk[r * c + z[r]] = 1.0f;
  }
  const AttentionParams& a = p.base;
  for (int64_t r = 0; a.mask && r < rows; ++r) {
    if (a.mask[b * a.mask_stride_b + (start + r) * a.mask_stride_n] != 0) continue;
    std::fill(pk + r * c, pk + (r + 1) * c, 0.0f);
    if (z) z[r] = -1;
  }
}

void add_code_moments(const float* P, const float* q, const float* dy, const float* delta,
                      int64_t rows, int64_t c, int64_t d, int64_t dv, float* T, float* wsum,
                      float* scratch) {
  float* x = scratch;
  float* dq = scratch + rows * d * dv;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t t = 0; t < d; ++t) {
      const float qt = q[i * d + t];
      float* xr = x + (i * d + t) * dv;
      for (int64_t e = 0; e < dv; ++e) xr[e] = qt * dy[i * dv + e];
      dq[i * d + t] = delta[i] * qt;
    }
  }
  // The cost of hard VQ's key gradient for the codes with many keys (the others take the
  // direct route, cpu/vq_key_routes.hpp): 2 rows c d dv flops here for c such codes, so
  // O(N c d dv) per head over a pass, d dv / (d + dv) times the forward's O(N c (d + dv));
  // memory c d dv per thread, independent of N.
  gemm(true, false, c, d * dv, rows, 1.0f, P, c, x, d * dv, 1.0f, T, d * dv);
  gemm(true, false, c, d, rows, 1.0f, P, c, dq, d, 1.0f, wsum, d);
}

void straight_through_dk(const float* T, const float* wsum, const int32_t* z, const float* v,
                         int64_t rows, int64_t d, int64_t dv, float scale, float* dk) {
  for (int64_t j = 0; j < rows; ++j) {
    if (z[j] < 0) continue;
    const float* Ts = T + z[j] * d * dv;
    const float* ws = wsum + z[j] * d;
    for (int64_t t = 0; t < d; ++t)
      dk[j * d + t] += scale * (dot(Ts + t * dv, v + j * dv, dv) - ws[t]);
  }
}

void soft_assign_backward(const float* pk, float* dp, const float* k, int64_t rows,
                          const float* codebook, int64_t c, int64_t d, float tau, float* dk,
                          float* dC, float* colsum) {
  // dE_js = p_js (dp_js - sum_t p_jt dp_jt), folded with the 2 / tau of d(-|k - C|^2 / tau).
  const float two_over_tau = 2.0f / tau;
  std::fill(colsum, colsum + c, 0.0f);
  for (int64_t j = 0; j < rows; ++j) {
    const float* p = pk + j * c;
    float* g = dp + j * c;
    const float mean = dot(p, g, c);
    float rowsum = 0.0f;
    for (int64_t s = 0; s < c; ++s) {
      g[s] = two_over_tau * p[s] * (g[s] - mean);
      rowsum += g[s];
      colsum[s] += g[s];
    }
    // dk_j = sum_s dE_js (C_s - k_j); the k_j term vanishes in exact arithmetic (rows of dE
    // sum to zero) and is kept for the rounding of the sum.
    for (int64_t t = 0; t < d; ++t) dk[j * d + t] -= rowsum * k[j * d + t];
  }
  gemm(false, false, rows, d, c, 1.0f, dp, c, codebook, d, 1.0f, dk, d);
  if (!dC) return;
  // dC_s += sum_j dE_js (k_j - C_s).
  gemm(true, false, c, d, rows, 1.0f, dp, c, k, d, 1.0f, dC, d);
  for (int64_t s = 0; s < c; ++s)
    for (int64_t t = 0; t < d; ++t) dC[s * d + t] -= colsum[s] * codebook[s * d + t];
}

}  // namespace favor::cpu
