// Bidirectional FAVOR attention, per (batch, head):
//   1. key tiles: project, stabilise against the running key max, S += phi^T V, s += phi^T 1;
//   2. log s once;
//   3. query tiles: project, shift each row by c_i = max_f (L_if + log s_f), y = phi S / phi s.
// Never holds more than one tile of features: memory O(threads * kRowTile * F).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/attention_params.hpp"
#include "cpu/blas.hpp"
#include "cpu/feature_tile.hpp"
#include "cpu/head_state.hpp"
#include "cpu/tiles.hpp"
#include "cpu/vec_math.hpp"

namespace favor::cpu {
namespace {

struct Workspace {
  std::vector<float> x, a, phi, v, y, den, ones, S, s, log_s;
  std::vector<double> half_norm2, g;
  Workspace(int64_t d, int64_t m, int64_t F, int64_t dv)
      : x(kRowTile * d),
        a(kRowTile * m),
        phi(kRowTile * F),
        v(kRowTile * dv),
        y(kRowTile * dv),
        den(kRowTile),
        ones(kRowTile, 1.0f),
        S(F * dv),
        s(F),
        log_s(F),
        half_norm2(kRowTile),
        g(kRowTile) {}
};

// Gathers the next tile of unmasked keys starting at *next; returns the row count.
int64_t gather_key_tile(const AttentionParams& p, const float* kh, const float* vh, int64_t b,
                        int64_t* next, Workspace& ws) {
  int64_t rows = 0;
  while (rows < kRowTile && *next < p.nk) {
    const int64_t j = (*next)++;
    if (p.mask && p.mask[b * p.mask_stride_b + j * p.mask_stride_n] == 0) continue;
    gather_rows(kh + j * p.k_strides[2], p.k_strides[2], p.k_strides[3], 1, p.d, p.sqrt_scale,
                ws.x.data() + rows * p.d, ws.half_norm2.data() + rows);
    gather_rows(vh + j * p.v_strides[2], p.v_strides[2], p.v_strides[3], 1, p.dv, 1.0f,
                ws.v.data() + rows * p.dv, nullptr);
    ++rows;
  }
  return rows;
}

int64_t run_head(const AttentionParams& p, int64_t b, int64_t h, Workspace& ws) {
  const int64_t m = p.m, F = feature_count(p.kernel, m);
  const float* qh = p.q + b * p.q_strides[0] + h * p.q_strides[1];
  const float* kh = p.k + b * p.k_strides[0] + h * p.k_strides[1];
  const float* vh = p.v + b * p.v_strides[0] + h * p.v_strides[1];
  float* oh = p.out + b * p.out_strides[0] + h * p.out_strides[1];
  HeadState state{ws.S.data(), ws.s.data(), F, p.dv};
  state.clear();

  for (int64_t next = 0; next < p.nk;) {
    const int64_t rows = gather_key_tile(p, kh, vh, b, &next, ws);
    if (rows == 0) break;
    project_rows(ws.x.data(), rows, p.d, p.w, m, ws.a.data());
    double tile_max = -INFINITY;
    for (int64_t r = 0; r < rows; ++r) {
      ws.g[r] = key_log_weight(p.kernel, ws.half_norm2[r]);
      tile_max = std::max(tile_max, key_log_max(p.kernel, ws.a.data() + r * m, m, ws.g[r]));
    }
    if (tile_max > state.max) state.raise_max(tile_max);
    for (int64_t r = 0; r < rows; ++r) {
      key_features(p.kernel, ws.a.data() + r * m, m, ws.g[r] - state.max, ws.phi.data() + r * F);
    }
    state.accumulate(ws.phi.data(), ws.v.data(), rows, ws.ones.data());
  }

  if (std::isinf(state.max)) {  // no visible key: every row is defined as zeros
    for (int64_t i = 0; i < p.nq; ++i)
      for (int64_t x = 0; x < p.dv; ++x) oh[i * p.out_strides[2] + x * p.out_strides[3]] = 0.0f;
    return p.nq;
  }
  if (positive_family(p.kernel)) log_or_neg_inf(ws.s.data(), ws.log_s.data(), F);

  int64_t zero_rows = 0;
  for (int64_t i0 = 0; i0 < p.nq; i0 += kRowTile) {
    const int64_t rows = std::min(kRowTile, p.nq - i0);
    gather_rows(qh + i0 * p.q_strides[2], p.q_strides[2], p.q_strides[3], rows, p.d, p.sqrt_scale,
                ws.x.data(), nullptr);
    project_rows(ws.x.data(), rows, p.d, p.w, m, ws.a.data());
    for (int64_t r = 0; r < rows; ++r) {
      const float* a = ws.a.data() + r * m;
      const float c = query_shift(p.kernel, a, m, ws.log_s.data());
      query_features(p.kernel, a, m, c, ws.log_s.data(), ws.phi.data() + r * F);
    }
    gemm(false, false, rows, p.dv, F, 1.0f, ws.phi.data(), F, ws.S.data(), p.dv, 0.0f, ws.y.data(),
         p.dv);
    gemv(false, rows, F, 1.0f, ws.phi.data(), F, ws.s.data(), 0.0f, ws.den.data());
    zero_rows += write_rows(ws.y.data(), ws.den.data(), rows, p.dv, oh + i0 * p.out_strides[2],
                            p.out_strides[2], p.out_strides[3]);
  }
  return zero_rows;
}

}  // namespace

int64_t favor_bidirectional(const AttentionParams& p) {
  const int64_t heads = p.batch * p.heads;
  const int threads = static_cast<int>(std::min<int64_t>(p.threads, heads));
  const int64_t F = feature_count(p.kernel, p.m);
  int64_t zero_rows = 0;
  // Workspaces are allocated here, outside the parallel region, so that an allocation
  // failure throws to the caller instead of terminating inside OpenMP.
  std::vector<Workspace> spaces;
  spaces.reserve(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) spaces.emplace_back(p.d, p.m, F, p.dv);
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) reduction(+ : zero_rows)
  for (int64_t bh = 0; bh < heads; ++bh) {
    zero_rows +=
        run_head(p, bh / p.heads, bh % p.heads, spaces[static_cast<size_t>(omp_get_thread_num())]);
  }
  return zero_rows;
}

}  // namespace favor::cpu
