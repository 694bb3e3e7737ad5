#include "cpu/causal_chunk.hpp"

#include <algorithm>
#include <cmath>

#include "cpu/blas.hpp"
#include "cpu/feature_tile.hpp"
#include "cpu/vec_math.hpp"

namespace favor::cpu {

ChunkWorkspace::ChunkWorkspace(int64_t d, int64_t m, int64_t F_, int64_t dv_)
    : F(F_),
      dv(dv_),
      x(2 * kProjectBlock * d),
      a(2 * kProjectBlock * m),
      block_half_norm2(kProjectBlock),
      wt(d * m),
      phik(kChunk * F_),
      qg(kChunk * (F_ + kChunk)),
      prefix(kChunk * F_),
      sv((F_ + kChunk) * (dv_ + 1)),
      yx(kChunk * (dv_ + 1)),
      s(F_),
      local(F_ * (dv_ + 1)),
      g(kChunk),
      run_max(kChunk),
      qshift(kChunk),
      visible(kChunk),
      tile(d, m, F_, dv_) {}

float rescale(double from, double to) {
  return from == to ? 1.0f : static_cast<float>(std::exp(from - to));
}

void load_block(const AttentionParams& p, int64_t b, int64_t h, int64_t begin, int64_t end,
                ChunkWorkspace& ws) {
  const int64_t bh = b * p.heads + h, n = end - begin;
  ws.block_bh = bh;
  ws.block_begin = begin;
  ws.block_end = end;
  const float* qh = p.q + b * p.q_strides[0] + h * p.q_strides[1];
  const float* kh = p.k + b * p.k_strides[0] + h * p.k_strides[1];
  gather_rows(kh + begin * p.k_strides[2], p.k_strides[2], p.k_strides[3], n, p.d, p.map.sqrt_scale,
              ws.x.data(), ws.block_half_norm2.data());
  gather_rows(qh + begin * p.q_strides[2], p.q_strides[2], p.q_strides[3], n, p.d, p.map.sqrt_scale,
              ws.x.data() + n * p.d, nullptr);
  // Keys and queries at once. Calls of at least one block project through W^T in pieces of
  // at most kSmallGemm / (m d) rows, which OpenBLAS runs on its small-matrix path (no packing
  // of W): 112 against 96 GFLOP/s for one 512 x 256 x 64 product (one thread). Shorter calls
  // skip the transpose of W. The path depends on the call alone, so that every sweep of a
  // call (forward and backward, whatever its blocks) projects a row the same way.
  const int64_t m = p.map.m;
  if (p.nq < kProjectBlock || small_gemm_rows(m, p.d) < 8) {
    project_rows(ws.x.data(), 2 * n, p.d, p.map.head_w(bh), m, ws.a.data(), p.map.head_bias(bh));
    return;
  }
  if (ws.wt_bh != bh) {
    const float* w = p.map.head_w(bh);
    for (int64_t f = 0; f < m; ++f)
      for (int64_t t = 0; t < p.d; ++t) ws.wt[t * m + f] = w[f * p.d + t];
    ws.wt_bh = bh;
  }
  project_rows_transposed(ws.x.data(), 2 * n, p.d, ws.wt.data(), m, ws.a.data(),
                          p.map.head_bias(bh));
}

bool block_holds(const ChunkWorkspace& ws, int64_t bh, int64_t c0, int64_t rows) {
  return ws.block_bh == bh && c0 >= ws.block_begin && c0 + rows <= ws.block_end;
}

void load_chunk(const AttentionParams& p, int64_t b, int64_t h, int64_t c0, int64_t rows, float* vx,
                ChunkWorkspace& ws) {
  ws.bh = b * p.heads + h;
  ws.c0 = c0;
  const int64_t n = ws.block_end - ws.block_begin, o = c0 - ws.block_begin, m = p.map.m;
  ws.xk = ws.x.data() + o * p.d;
  ws.xq = ws.x.data() + (n + o) * p.d;
  ws.ak = ws.a.data() + o * m;
  ws.aq = ws.a.data() + (n + o) * m;
  ws.half_norm2 = ws.block_half_norm2.data() + o;
  for (int64_t r = 0; r < rows; ++r) {
    ws.visible[r] =
        p.mask == nullptr || p.mask[b * p.mask_stride_b + (c0 + r) * p.mask_stride_n] != 0;
  }
  const float* vh = p.v + b * p.v_strides[0] + h * p.v_strides[1];
  gather_values(vh + c0 * p.v_strides[2], p.v_strides[2], p.v_strides[3], rows, p.dv, vx);
}

bool chunk_key_features(const AttentionParams& p, int64_t rows, double prev_max,
                        ChunkWorkspace& ws) {
  const int64_t m = p.map.m, F = ws.F;
  double running = prev_max;
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = ws.ak + r * m;
    ws.g[r] = p.map.key_log_weight(ws.half_norm2[r], ws.bh, p.first_position + ws.c0 + r);
    if (ws.visible[r]) running = std::max(running, key_log_max(p.map, ws.bh, a, ws.g[r]));
    ws.run_max[r] = running;
    float* phi = ws.phik.data() + r * F;
    if (ws.visible[r]) {
      key_features(p.map, ws.bh, a, ws.g[r] - running, phi);
    } else {
      std::fill(phi, phi + F, 0.0f);
    }
  }
  return ws.run_max[0] != ws.run_max[rows - 1] || ws.run_max[0] != prev_max;
}

void chunk_query_features(const AttentionParams& p, int64_t rows, const float* s_prev,
                          double prev_max, ChunkWorkspace& ws) {
  const int64_t m = p.map.m, F = ws.F;
  const float* aq = ws.aq;
  const bool pos = positive_family(p.map.kernel);
  for (int64_t r = 0; pos && r < rows; ++r) {
    float* row = ws.prefix.data() + r * F;
    const float* prev = r == 0 ? s_prev : row - F;
    const float f = rescale(r == 0 ? prev_max : ws.run_max[r - 1], ws.run_max[r]);
    scale_add(prev, f, ws.phik.data() + r * F, row, F);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = aq + r * m;
    float* phi = ws.qg.data() + r * ws.ldq();
    const float* prefix = ws.prefix.data() + r * F;  // unused by trig
    const float c = query_shift_sums(p.map.kernel, a, m, prefix);
    ws.qshift[r] = c;
    if (std::isinf(c)) {  // no visible key yet: zero features give a zero denominator
      std::fill(phi, phi + F, 0.0f);
    } else {
      query_features_sums(p.map.kernel, a, m, c, prefix, phi);
    }
  }
}

void chunk_kernel_matrix(int64_t rows, bool moved, ChunkWorkspace& ws) {
  const int64_t F = ws.F, ldq = ws.ldq();
  float* G = ws.qg.data() + F;
  // Only j <= i is needed: the top half of the rows against the first half of the keys, the
  // bottom half against all, 3/4 of the full product (C = 32: 3.8 us against 5.0 us for the
  // full one, one thread, F = 256).
  const int64_t top = rows / 2;
  if (top > 0)
    gemm(false, true, top, top, F, 1.0f, ws.qg.data(), ldq, ws.phik.data(), F, 0.0f, G, ldq);
  gemm(false, true, rows - top, rows, F, 1.0f, ws.qg.data() + top * ldq, ldq, ws.phik.data(), F,
       0.0f, G + top * ldq, ldq);
  for (int64_t i = 0; i < rows; ++i) {
    float* gi = G + i * ldq;
    std::fill(gi + i + 1, gi + rows, 0.0f);
    if (moved) {
      for (int64_t j = 0; j <= i; ++j) gi[j] *= rescale(ws.run_max[j], ws.run_max[i]);
    }
  }
}

void chunk_output(int64_t rows, double state_max, bool moved, ChunkWorkspace& ws,
                  bool empty_state) {
  const int64_t F = ws.F, ldq = ws.ldq(), ldv = ws.dv + 1;
  if (moved) {
    for (int64_t i = 0; i < rows; ++i) {
      const float f = rescale(state_max, ws.run_max[i]);
      float* phi = ws.qg.data() + i * ldq;
      for (int64_t x = 0; x < F; ++x) phi[x] *= f;
    }
  }
  if (empty_state) {  // G [V_c | 1] alone: the state's rows are zero
    gemm(false, false, rows, ldv, rows, 1.0f, ws.qg.data() + F, ldq, ws.sv.data() + F * ldv, ldv,
         0.0f, ws.yx.data(), ldv);
    return;
  }
  gemm(false, false, rows, ldv, F + rows, 1.0f, ws.qg.data(), ldq, ws.sv.data(), ldv, 0.0f,
       ws.yx.data(), ldv);
}

void chunk_state_update(int64_t rows, bool moved, HeadState& state, const float* vx,
                        ChunkWorkspace& ws) {
  const int64_t F = ws.F;
  const double last = ws.run_max[rows - 1];
  if (last > state.max) state.raise_max(last);
  if (moved) {
    for (int64_t j = 0; j < rows; ++j) {
      const float f = rescale(ws.run_max[j], last);
      float* phi = ws.phik.data() + j * F;
      for (int64_t x = 0; x < F; ++x) phi[x] *= f;
    }
  }
  state.accumulate(ws.phik.data(), vx, rows);
}

}  // namespace favor::cpu
