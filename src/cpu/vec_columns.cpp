// The band kernel's element-wise steps down a tile's columns (declared in cpu/vec_math.hpp):
// Highway compiles this file once per SIMD target and dispatches to the best one.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/vec_columns.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cpu/exp_or_inf-inl.h"

HWY_BEFORE_NAMESPACE();
namespace favor::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

// The columns of a [cols][rows] block, each lane a row: the accumulators stay in registers
// over the columns (the band kernel's scores: a tile's keys along its rows, its queries
// along the columns).
void ColumnsMax(const float* x, int64_t cols, int64_t rows, float* top) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t r = 0;
  for (; r + lanes <= rows; r += lanes) {
    auto m = hn::LoadU(d, top + r);
    for (int64_t c = 0; c < cols; ++c) m = hn::Max(m, hn::LoadU(d, x + c * rows + r));
    hn::StoreU(m, d, top + r);
  }
  for (; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) top[r] = std::max(top[r], x[c * rows + r]);
}

void ColumnsExp(float* x, int64_t cols, int64_t rows, const float* shift, float* sum) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t r = 0;
  for (; r + lanes <= rows; r += lanes) {
    const auto s = hn::LoadU(d, shift + r);
    auto acc = sum ? hn::LoadU(d, sum + r) : hn::Zero(d);
    for (int64_t c = 0; c < cols; ++c) {
      const auto e = ExpOrInf(d, hn::Add(hn::LoadU(d, x + c * rows + r), s));
      hn::StoreU(e, d, x + c * rows + r);
      acc = hn::Add(acc, e);
    }
    if (sum) hn::StoreU(acc, d, sum + r);
  }
  for (; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float& e = x[c * rows + r];
      e = std::exp(e + shift[r]);
      if (sum) sum[r] += e;
    }
}

void ColumnsScoreGrad(float* dp, const float* p, int64_t cols, int64_t rows, const float* delta,
                      float scale) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto vs = hn::Set(d, scale), zero = hn::Zero(d);
  int64_t r = 0;
  for (; r + lanes <= rows; r += lanes) {
    const auto dl = hn::LoadU(d, delta + r);
    for (int64_t c = 0; c < cols; ++c) {
      const auto w = hn::LoadU(d, p + c * rows + r);
      const auto g = hn::Mul(hn::Mul(vs, w), hn::Sub(hn::LoadU(d, dp + c * rows + r), dl));
      hn::StoreU(hn::IfThenZeroElse(hn::Eq(w, zero), g), d, dp + c * rows + r);
    }
  }
  for (; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float w = p[c * rows + r];
      float& x = dp[c * rows + r];
      x = w == 0.0f ? 0.0f : scale * w * (x - delta[r]);
    }
}

}  // namespace favor::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "cpu/vec_math.hpp"

namespace favor::cpu {
HWY_EXPORT(ColumnsMax);
HWY_EXPORT(ColumnsExp);
HWY_EXPORT(ColumnsScoreGrad);

void columns_max(const float* x, int64_t cols, int64_t rows, float* top) {
  HWY_DYNAMIC_DISPATCH(ColumnsMax)(x, cols, rows, top);
}
void columns_exp(float* x, int64_t cols, int64_t rows, const float* shift, float* sum) {
  HWY_DYNAMIC_DISPATCH(ColumnsExp)(x, cols, rows, shift, sum);
}
void columns_score_grad(float* dp, const float* p, int64_t cols, int64_t rows, const float* delta,
                        float scale) {
  HWY_DYNAMIC_DISPATCH(ColumnsScoreGrad)(dp, p, cols, rows, delta, scale);
}

}  // namespace favor::cpu
#endif  // HWY_ONCE
