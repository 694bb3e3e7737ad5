#include "cpu/vq_state.hpp"

#include <algorithm>
#include <cmath>

#include "cpu/blas.hpp"
#include "cpu/feature_tile.hpp"
#include "cpu/head_state.hpp"
#include "cpu/vec_math.hpp"
#include "cpu/vq_assign.hpp"

namespace favor::cpu {

VQWorkspace::VQWorkspace(int64_t d, int64_t codes_, int64_t dv_, int64_t rows_)
    : codes(codes_),
      dv(dv_),
      rows(rows_),
      x(rows_ * d),
      sv((codes_ + rows_) * (dv_ + 1)),
      xg(rows_ * (codes_ + rows_)),
      p(rows_ * codes_),
      count(codes_),
      log_n(codes_),
      yx(rows_ * (dv_ + 1)),
      z(rows_),
      visible(rows_) {}

void gather_head_rows(const float* base, const Shape4& st, int64_t b, int64_t h, int64_t start,
                      int64_t rows, int64_t width, float* dst) {
  gather_rows(base + b * st[0] + h * st[1] + start * st[2], st[2], st[3], rows, width, 1.0f, dst,
              nullptr);
}

int64_t gather_visible_keys(const VQParams& p, int64_t b, int64_t h, int64_t* next, int64_t end,
                            float* vx, VQWorkspace& ws) {
  const AttentionParams& a = p.base;
  const float* kh = a.k + b * a.k_strides[0] + h * a.k_strides[1];
  const float* vh = a.v + b * a.v_strides[0] + h * a.v_strides[1];
  int64_t rows = 0;
  for (; *next < end && rows < ws.rows; ++*next) {
    const int64_t j = *next;
    if (!key_visible(a, b, j)) continue;
    gather_rows(kh + j * a.k_strides[2], a.k_strides[2], a.k_strides[3], 1, a.d, 1.0f,
                ws.x.data() + rows * a.d, nullptr);
    gather_values(vh + j * a.v_strides[2], a.v_strides[2], a.v_strides[3], 1, a.dv,
                  vx + rows * ws.ld());
    ++rows;
  }
  return rows;
}

void gather_key_block(const VQParams& p, int64_t b, int64_t h, int64_t j0, int64_t rows, float* vx,
                      VQWorkspace& ws) {
  const AttentionParams& a = p.base;
  const float* vh = a.v + b * a.v_strides[0] + h * a.v_strides[1];
  gather_head_rows(a.k, a.k_strides, b, h, j0, rows, a.d, ws.x.data());
  gather_values(vh + j0 * a.v_strides[2], a.v_strides[2], a.v_strides[3], rows, a.dv, vx);
  for (int64_t r = 0; r < rows; ++r) {
    ws.visible[r] = key_visible(a, b, j0 + r);
    if (!ws.visible[r]) std::fill(vx + r * ws.ld(), vx + (r + 1) * ws.ld(), 0.0f);
  }
}

void query_logits(const VQParams& p, int64_t b, int64_t h, int64_t i0, int64_t rows,
                  const float* codebook, int64_t ldl, VQWorkspace& ws) {
  const AttentionParams& a = p.base;
  gather_head_rows(a.q, a.q_strides, b, h, i0, rows, a.d, ws.x.data());
  gemm(false, true, rows, p.codes, a.d, p.scale, ws.x.data(), a.d, codebook, a.d, 0.0f,
       ws.xg.data(), ldl);
}

void assign_keys(const VQParams& p, const CodeTable& table, int64_t rows, const char* visible,
                 VQWorkspace& ws) {
  const int64_t c = p.codes;
  assign_rows(ws.x.data(), rows, table, p.tau, ws.z.data(), ws.p.data());
  if (p.tau == 0.0f) return;
  for (int64_t r = 0; visible && r < rows; ++r)
    if (!visible[r]) std::fill(ws.p.data() + r * c, ws.p.data() + (r + 1) * c, 0.0f);
}

void add_to_state(const VQParams& p, int64_t rows, const float* vx, const char* visible,
                  VQWorkspace& ws) {
  const int64_t ld = ws.ld();
  float* state = ws.state();
  if (p.tau == 0.0f) {
    for (int64_t r = 0; r < rows; ++r) {
      if (visible && !visible[r]) continue;
      float* dst = state + ws.z[r] * ld;
      const float* src = vx + r * ld;
      for (int64_t x = 0; x < ld; ++x) dst[x] += src[x];
    }
    return;
  }
  gemm(true, false, p.codes, ld, rows, 1.0f, ws.p.data(), p.codes, vx, ld, 1.0f, state, ld);
}

float code_weights(const float* L, const float* log_n, int64_t codes, float* x) {
  const float m = max_of_signed_sum(L, 1.0f, log_n, codes);
  exp_shift_live(L, 1.0f, m, log_n, x, codes);
  return m;
}

}  // namespace favor::cpu
