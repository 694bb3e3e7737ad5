#pragma once
// Naive materialised formulas, templated on the arithmetic type. reference.cpp exposes
// the double instantiation as favor::reference; tests also use the float one, a naive
// same-precision implementation, to bound the fast kernels' rounding error.
#include <cmath>
#include <vector>

#include "favor/attention.hpp"
#include "favor/reference.hpp"

namespace favor::reference::naive {

/// phi(x) of one head as N x F, constants kept, in T.
template <class T>
std::vector<T> head_features(const TensorView& x, int64_t b, int64_t h, const Projection& w,
                             Kernel kernel, double scale) {
  const int64_t n = x.shape[2], d = x.shape[3], m = w.m(), F = feature_count(kernel, m);
  const T ss = static_cast<T>(std::sqrt(scale));
  std::vector<T> phi(static_cast<size_t>(n * F));
  std::vector<T> xs(static_cast<size_t>(d));
  for (int64_t i = 0; i < n; ++i) {
    T norm2 = 0;
    for (int64_t t = 0; t < d; ++t) {
      xs[t] = ss * static_cast<T>(x.at(b, h, i, t));
      norm2 += xs[t] * xs[t];
    }
    for (int64_t f = 0; f < m; ++f) {
      T a = 0;
      for (int64_t t = 0; t < d; ++t) a += static_cast<T>(w.at(f, t)) * xs[t];
      T* row = phi.data() + i * F;
      switch (kernel) {
        case Kernel::positive:
          row[f] = std::exp(a - norm2 / 2) / std::sqrt(static_cast<T>(m));
          break;
        case Kernel::trig: {
          const T c = std::exp(norm2 / 2) / std::sqrt(static_cast<T>(m));
          row[f] = c * std::sin(a);
          row[m + f] = c * std::cos(a);
          break;
        }
        case Kernel::hyperbolic: {
          const T c = std::exp(-norm2 / 2) / std::sqrt(static_cast<T>(2 * m));
          row[f] = c * std::exp(a);
          row[m + f] = c * std::exp(-a);
          break;
        }
      }
    }
  }
  return phi;
}

inline bool key_visible(const std::optional<KeyMaskView>& mask, int64_t b, int64_t j) {
  return !mask || mask->at(b, j);
}

/// Materialised FAVOR attention in T: [B, H, Nq, Dv] C-contiguous.
template <class T>
std::vector<T> favor_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                               const Projection& w, const AttentionOptions& o) {
  const int64_t B = q.shape[0], H = q.shape[1], nq = q.shape[2], nk = k.shape[2], dv = v.shape[3];
  const double scale = o.scale ? *o.scale : 1.0 / std::sqrt(static_cast<double>(q.shape[3]));
  const int64_t F = feature_count(o.kernel, w.m());
  std::vector<T> out(static_cast<size_t>(B * H * nq * dv), T(0));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const auto pq = head_features<T>(q, b, h, w, o.kernel, scale);
      const auto pk = head_features<T>(k, b, h, w, o.kernel, scale);
      for (int64_t i = 0; i < nq; ++i) {
        std::vector<T> num(static_cast<size_t>(dv), T(0));
        T den = 0;
        for (int64_t j = 0; j < nk; ++j) {
          if ((o.causal && j > i) || !key_visible(o.key_mask, b, j)) continue;
          T a = 0;
          for (int64_t f = 0; f < F; ++f) a += pq[i * F + f] * pk[j * F + f];
          den += a;
          for (int64_t x = 0; x < dv; ++x) num[x] += a * static_cast<T>(v.at(b, h, j, x));
        }
        T* dst = out.data() + ((b * H + h) * nq + i) * dv;
        const bool ok = den > 0 && std::isfinite(den);
        for (int64_t x = 0; x < dv; ++x) dst[x] = ok ? num[x] / den : T(0);
      }
    }
  return out;
}

}  // namespace favor::reference::naive
