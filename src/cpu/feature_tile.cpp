#include "cpu/feature_tile.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/blas.hpp"
#include "cpu/tiles.hpp"
#include "cpu/vec_math.hpp"

namespace favor::cpu {

void gather_rows(const float* base, int64_t stride_n, int64_t stride_d, int64_t rows, int64_t d,
                 float mult, float* dst, double* half_norm2) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = base + r * stride_n;
    float* out = dst + r * d;
    double norm2 = 0.0;
    if (stride_d == 1 && !half_norm2) {
      scale_copy(src, mult, out, d);  // the double norm's FMA chain costs as much as the copy
    } else if (stride_d == 1) {
      norm2 = scale_copy_norm2(src, mult, out, d);
    } else {
      for (int64_t x = 0; x < d; ++x) {
        out[x] = mult * src[x * stride_d];
        norm2 += static_cast<double>(out[x]) * out[x];
      }
    }
    if (half_norm2) half_norm2[r] = 0.5 * norm2;
  }
}

void project_rows(const float* x, int64_t rows, int64_t d, const float* w, int64_t m, float* a,
                  const float* bias) {
  gemm(false, true, rows, m, d, 1.0f, x, d, w, d, 0.0f, a, m);
  if (!bias) return;
  for (int64_t r = 0; r < rows; ++r) {
    float* row = a + r * m;
    for (int64_t f = 0; f < m; ++f) row[f] += bias[f];
  }
}

void project_rows_transposed(const float* x, int64_t rows, int64_t d, const float* wt, int64_t m,
                             float* a, const float* bias) {
  const int64_t piece = small_gemm_rows(m, d);
  for (int64_t r0 = 0; r0 < rows; r0 += piece)
    gemm(false, false, std::min(piece, rows - r0), m, d, 1.0f, x + r0 * d, d, wt, m, 0.0f,
         a + r0 * m, m);
  if (!bias) return;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t f = 0; f < m; ++f) a[r * m + f] += bias[f];
}

double key_log_max(const FeatureParams& map, int64_t bh, const float* a_row, double g) {
  const int64_t m = map.m;
  const float* lw = map.head_key_logw(bh);
  switch (map.kernel) {
    case Kernel::positive:
    case Kernel::favorpp:
    case Kernel::favorsharp:
      return static_cast<double>(lw ? max_of_signed_sum(a_row, 1.0f, lw, m) : max_value(a_row, m)) +
             g;
    case Kernel::hyperbolic:
    case Kernel::hedgehog:
      if (lw) {
        return static_cast<double>(std::max(max_of_signed_sum(a_row, 1.0f, lw, m),
                                            max_of_signed_sum(a_row, -1.0f, lw, m))) +
               g;
      }
      return static_cast<double>(std::max(max_value(a_row, m), -min_value(a_row, m))) + g;
    case Kernel::trig:
      return lw ? g + static_cast<double>(max_value(lw, m)) : g;
  }
  return g;
}

void key_features(const FeatureParams& map, int64_t bh, const float* a_row, double off,
                  float* phi) {
  const int64_t m = map.m;
  const auto offset = static_cast<float>(off);
  const float* lw = map.head_key_logw(bh);
  switch (map.kernel) {
    case Kernel::positive:
    case Kernel::favorpp:
    case Kernel::favorsharp:
      if (lw) {
        exp_affine_plus(a_row, 1.0f, offset, lw, phi, m);
      } else {
        exp_affine(a_row, 1.0f, offset, phi, m);
      }
      break;
    case Kernel::hyperbolic:
    case Kernel::hedgehog:
      if (lw) {
        exp_affine_plus(a_row, 1.0f, offset, lw, phi, m);
        exp_affine_plus(a_row, -1.0f, offset, lw, phi + m, m);
      } else {
        exp_affine(a_row, 1.0f, offset, phi, m);
        exp_affine(a_row, -1.0f, offset, phi + m, m);
      }
      break;
    case Kernel::trig: {
      if (!lw) {
        sincos_scaled(a_row, static_cast<float>(std::exp(off)), phi, phi + m, m);
        break;
      }
      // lambda_f^2 exp(off) = exp(l_f + off) per feature, formed in the exponent (no overflow
      // of lambda^2 against an underflowing exp(off)).
      thread_local std::vector<float> weight;
      weight.resize(static_cast<size_t>(m));
      exp_affine(lw, 1.0f, offset, weight.data(), m);
      sincos_scaled(a_row, 1.0f, phi, phi + m, m);
      for (int64_t f = 0; f < m; ++f) {
        phi[f] *= weight[f];
        phi[m + f] *= weight[f];
      }
      break;
    }
  }
}

namespace {

// The exponential halves of a kernel's query features: the positive family has one (sign
// +1, entries [0, m)), hyperbolic and hedgehog two (+1, then -1 at [m, 2m)), trig none (sin
// and cos, no shift).
int exp_halves(Kernel kernel) {
  switch (kernel) {
    case Kernel::positive:
    case Kernel::favorpp:
    case Kernel::favorsharp:
      return 1;
    case Kernel::hyperbolic:
    case Kernel::hedgehog:
      return 2;
    case Kernel::trig:
      return 0;
  }
  return 0;
}

// The query's shift: the max of max_half(sign, offset) over the halves (0 for trig).
template <class MaxHalf>
float shift_over_halves(Kernel kernel, int64_t m, const MaxHalf& max_half) {
  const int halves = exp_halves(kernel);
  if (halves == 0) return 0.0f;
  const float first = max_half(1.0f, 0);
  return halves == 2 ? std::max(first, max_half(-1.0f, m)) : first;
}

// The query's features: exp_half(sign, offset) per half, or sin and cos (trig).
template <class ExpHalf>
void features_over_halves(Kernel kernel, const float* a_row, int64_t m, float* phi,
                          const ExpHalf& exp_half) {
  const int halves = exp_halves(kernel);
  if (halves == 0) sincos_scaled(a_row, 1.0f, phi, phi + m, m);
  for (int h = 0; h < halves; ++h) exp_half(h == 0 ? 1.0f : -1.0f, h * m);
}

}  // namespace

float query_shift(Kernel kernel, const float* a_row, int64_t m, const float* log_s) {
  return shift_over_halves(kernel, m, [&](float sign, int64_t o) {
    return max_of_signed_sum(a_row, sign, log_s + o, m);
  });
}

void query_features(Kernel kernel, const float* a_row, int64_t m, float c, const float* log_s,
                    float* phi) {
  features_over_halves(kernel, a_row, m, phi, [&](float sign, int64_t o) {
    exp_shift_live(a_row, sign, c, log_s + o, phi + o, m);
  });
}

float query_shift_sums(Kernel kernel, const float* a_row, int64_t m, const float* s) {
  return shift_over_halves(kernel, m, [&](float sign, int64_t o) {
    return max_of_signed_sum_log(a_row, sign, s + o, m);
  });
}

void query_features_sums(Kernel kernel, const float* a_row, int64_t m, float c, const float* s,
                         float* phi) {
  features_over_halves(kernel, a_row, m, phi, [&](float sign, int64_t o) {
    exp_shift_live_sums(a_row, sign, c, s + o, phi + o, m);
  });
}

}  // namespace favor::cpu
