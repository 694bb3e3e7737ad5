#include "cpu/feature_grad.hpp"

#include <algorithm>
#include <cmath>

#include "cpu/blas.hpp"
#include "cpu/vec_math.hpp"

namespace favor::cpu {

namespace {

// The KeyRows gradients of `rows` key rows (feature_grad.hpp).
void key_log_weight_grads(const FeatureParams& map, const KeyRows& key, int64_t rows,
                          const float* phi, const float* dphi) {
  const int64_t m = map.m, F = map.features();
  if (key.dlogw) {
    // Row f makes features f and (two-sided and trig kernels) m + f, each times lambda_f^2.
    const bool paired = F == 2 * m;
    for (int64_t f = 0; f < m; ++f) {
      double sum = 0.0;
      for (int64_t r = 0; r < rows; ++r) {
        const float* p = phi + r * F;
        const float* dp = dphi + r * F;
        sum += static_cast<double>(dp[f]) * p[f];
        if (paired) sum += static_cast<double>(dp[m + f]) * p[m + f];
      }
      key.dlogw[f] += static_cast<float>(sum);
    }
  }
}

}  // namespace

void feature_backward(const FeatureParams& map, int64_t bh, const KeyRows* key, int64_t rows,
                      const float* x, const float* phi, const float* dphi, float* pa, float* dx,
                      float* dw, float* db) {
  const Kernel kernel = map.kernel;
  const int64_t m = map.m, d = map.d, F = map.features();
  const float* w = map.head_w(bh);
  const float sqrt_scale = map.sqrt_scale;
  for (int64_t r = 0; r < rows; ++r) {
    const float* p = phi + r * F;
    const float* dp = dphi + r * F;
    float* out = pa + r * m;
    switch (kernel) {
      case Kernel::positive:
      case Kernel::favorpp:
      case Kernel::favorsharp:
        for (int64_t f = 0; f < m; ++f) out[f] = dp[f] * p[f];
        break;
      case Kernel::hyperbolic:
      case Kernel::hedgehog:
        for (int64_t f = 0; f < m; ++f) out[f] = dp[f] * p[f] - dp[m + f] * p[m + f];
        break;
      case Kernel::trig:
        for (int64_t f = 0; f < m; ++f) out[f] = dp[f] * p[m + f] - dp[m + f] * p[f];
        break;
    }
  }
  gemm(false, false, rows, d, m, sqrt_scale, pa, m, w, d, 0.0f, dx, d);
  if (key && map.key_norm != KeyNorm::none) {
    const float sign = map.key_norm == KeyNorm::plus_half ? 1.0f : -1.0f;
    for (int64_t r = 0; r < rows; ++r) {
      const float total = dot(dphi + r * F, phi + r * F, F);
      for (int64_t t = 0; t < d; ++t) dx[r * d + t] += sqrt_scale * sign * total * x[r * d + t];
    }
  }
  if (key) key_log_weight_grads(map, *key, rows, phi, dphi);
  if (dw) gemm(true, false, m, d, rows, 1.0f, pa, m, x, d, 1.0f, dw, d);
  for (int64_t r = 0; db && r < rows; ++r)
    for (int64_t f = 0; f < m; ++f) db[f] += pa[r * m + f];
}

void upstream_rows(const float* yx, const float* dy, int64_t dy_stride_n, int64_t dy_stride_d,
                   int64_t rows, int64_t dv, float* gx) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = yx + r * (dv + 1);
    float* g = gx + r * (dv + 1);
    const float den = src[dv];
    if (dy_stride_d == 1) {
      if (!(den > 0.0f) || !upstream_row(src, den, dy + r * dy_stride_n, g, dv))
        std::fill(g, g + dv + 1, 0.0f);
      continue;
    }
    bool ok = den > 0.0f;
    float dot = 0.0f;
    for (int64_t x = 0; ok && x < dv; ++x) {
      const float y = src[x] / den;
      ok = std::isfinite(y);
      const float d = dy[r * dy_stride_n + x * dy_stride_d];
      dot += d * y;
      g[x] = d / den;
    }
    if (ok) {
      g[dv] = -dot / den;
    } else {
      std::fill(g, g + dv + 1, 0.0f);
    }
  }
}

}  // namespace favor::cpu
