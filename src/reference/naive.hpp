#pragma once
// Naive materialised formulas, templated on the arithmetic type. reference.cpp exposes
// the double instantiation as favor::reference; tests also use the float one, a naive
// same-precision implementation, to bound the fast kernels' rounding error.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/feature_map_params.hpp"
#include "core/validate.hpp"
#include "favor/attention.hpp"
#include "favor/error.hpp"
#include "favor/estimators.hpp"
#include "favor/feature_map.hpp"
#include "favor/reference.hpp"

namespace favor::reference::naive {

/// The map of head bh in double: the projection (W, the learned W_h of parameter set
/// bh % heads, or the FAVOR++ / FAVOR# effective projection Q diag(sqrt(1 - 4 A_l)) w_f), the
/// bias per feature (the learned b_h, the FAVOR++ / FAVOR# log bias sum_l A_l w_fl^2, or zero),
/// the feature weights lambda (or ones) and the log of the constant factor (math.md s.2; zero
/// for hedgehog). Built here from the map and the fit directly, independently of the library's
/// float path (src/estimators.cpp, src/core/feature_map_params.cpp).
struct HeadMap {
  std::vector<double> w, bias, lambda;
  double log_c = 0.0;
};

inline HeadMap head_map(const FeatureMap& fm, const std::optional<KernelFit>& fit, int64_t bh) {
  const Projection& w = fm.projection;
  const int64_t m = w.m(), d = w.d(), set = bh % fm.heads;
  auto row_set = [&](const std::vector<float>& values, int64_t per_set, double fill) {
    if (values.empty()) return std::vector<double>(static_cast<size_t>(per_set), fill);
    const float* first = values.data() + set * per_set;
    return std::vector<double>(first, first + per_set);
  };
  HeadMap map{fm.weights.empty() ? std::vector<double>(w.matrix().begin(), w.matrix().end())
                                 : row_set(fm.weights, m * d, 0.0),
              row_set(fm.bias, m, 0.0), row_set(fm.lambda, m, 1.0), 0.0};
  if (fm.kernel != Kernel::hedgehog) {
    map.log_c = -0.5 * std::log(static_cast<double>(fm.kernel == Kernel::hyperbolic ? 2 * m : m));
  }
  if (!data_adapted(fm.kernel)) return map;
  const int64_t g = fit->heads == 1 ? 0 : bh;
  const double* a = fit->a.data() + g * d;
  const double* q = fit->basis.data() + g * d * d;
  for (int64_t l = 0; l < d; ++l) map.log_c += 0.25 * std::log(1.0 - 4.0 * a[l]);
  for (int64_t f = 0; f < m; ++f) {
    double bias = 0.0;
    for (int64_t l = 0; l < d; ++l) bias += a[l] * w.at(f, l) * w.at(f, l);
    map.bias[f] = bias;
    for (int64_t t = 0; t < d; ++t) {
      double sum = 0.0;
      for (int64_t l = 0; l < d; ++l)
        sum += q[t * d + l] * std::sqrt(1.0 - 4.0 * a[l]) * w.at(f, l);
      map.w[f * d + t] = sum;
    }
  }
  return map;
}

/// The map of a Projection with a kernel (no learned parameters).
inline HeadMap head_map(const Projection& w, Kernel kernel, const std::optional<KernelFit>& fit,
                        int64_t bh) {
  return head_map(FeatureMap(w, kernel), fit, bh);
}

/// The adjoint of head_map, evaluated in T: dw (m x d) += dL/dW from the gradients with
/// respect to head bh's map, dL/dW_h (dw_map, m x d) and dL/db (dbias, m). For FAVOR++ /
/// FAVOR#, from W_h[f][t] = sum_l Q[t][l] sqrt(1 - 4 A_l) w_fl and b_f = sum_l A_l w_fl^2:
///   dL/dw_fl = sum_t dL/dW_h[f][t] Q[t][l] sqrt(1 - 4 A_l) + 2 A_l w_fl dL/db_f;
/// for the fixed kernels the map is W itself.
template <class T>
void head_map_backward(const Projection& w, Kernel kernel, const std::optional<KernelFit>& fit,
                       int64_t bh, const std::vector<T>& dw_map, const std::vector<T>& dbias,
                       std::vector<T>& dw) {
  const int64_t m = w.m(), d = w.d();
  if (!data_adapted(kernel)) {
    for (int64_t i = 0; i < m * d; ++i) dw[i] += dw_map[i];
    return;
  }
  const int64_t g = fit->heads == 1 ? 0 : bh;
  const double* a = fit->a.data() + g * d;
  const double* q = fit->basis.data() + g * d * d;
  for (int64_t f = 0; f < m; ++f)
    for (int64_t l = 0; l < d; ++l) {
      const T root = std::sqrt(T(1) - T(4) * static_cast<T>(a[l]));
      T sum = T(2) * static_cast<T>(a[l]) * static_cast<T>(w.at(f, l)) * dbias[f];
      for (int64_t t = 0; t < d; ++t)
        sum += dw_map[f * d + t] * static_cast<T>(q[t * d + l]) * root;
      dw[f * d + l] += sum;
    }
}

/// The fit an attention call with `kernel` and `fit` (a map's, or the options') uses: `fit`,
/// or (bidirectional) the library's fit to q and k; causal calls without a fit throw, as the
/// library does.
inline std::optional<KernelFit> attention_fit(const TensorView& q, const TensorView& k,
                                              Kernel kernel, const std::optional<KernelFit>& fit,
                                              const AttentionOptions& o, double scale) {
  if (!data_adapted(kernel) || fit) return fit;
  if (o.causal) throw Error("fit: causal " + to_string(kernel) + " attention needs a fit");
  return fit_kernel(kernel, q, k, scale, o.key_mask);
}

inline std::optional<KernelFit> attention_fit(const TensorView& q, const TensorView& k,
                                              const AttentionOptions& o, double scale) {
  return attention_fit(q, k, o.kernel, o.fit, o, scale);
}

/// phi(x) of one head as N x F, constants and feature weights kept, in T (feature_map.hpp):
/// lambda_f times the kernel's features of row f, a = W_h x' + b_h, x' = sqrt(scale) x.
template <class T>
std::vector<T> head_features(const TensorView& x, int64_t b, int64_t h, const FeatureMap& fm,
                             double scale, const std::optional<KernelFit>& fit) {
  const int64_t n = x.shape[2], d = x.shape[3], m = fm.m(), F = fm.features();
  const HeadMap map = head_map(fm, fit, b * x.shape[1] + h);
  const T ss = static_cast<T>(std::sqrt(scale));
  const T c = std::exp(static_cast<T>(map.log_c));
  std::vector<T> phi(static_cast<size_t>(n * F));
  std::vector<T> xs(static_cast<size_t>(d));
  for (int64_t i = 0; i < n; ++i) {
    T norm2 = 0;
    for (int64_t t = 0; t < d; ++t) {
      xs[t] = ss * static_cast<T>(x.at(b, h, i, t));
      norm2 += xs[t] * xs[t];
    }
    for (int64_t f = 0; f < m; ++f) {
      T a = static_cast<T>(map.bias[f]);
      for (int64_t t = 0; t < d; ++t) a += static_cast<T>(map.w[f * d + t]) * xs[t];
      const T lc = static_cast<T>(map.lambda[f]) * c;  // lambda_f and the constant
      T* row = phi.data() + i * F;
      switch (fm.kernel) {
        case Kernel::positive:
        case Kernel::favorpp:
        case Kernel::favorsharp:
          row[f] = lc * std::exp(a - norm2 / 2);
          break;
        case Kernel::trig:
          row[f] = lc * std::exp(norm2 / 2) * std::sin(a);
          row[m + f] = lc * std::exp(norm2 / 2) * std::cos(a);
          break;
        case Kernel::hyperbolic:
          row[f] = lc * std::exp(-norm2 / 2) * std::exp(a);
          row[m + f] = lc * std::exp(-norm2 / 2) * std::exp(-a);
          break;
        case Kernel::hedgehog:
          row[f] = lc * std::exp(a);
          row[m + f] = lc * std::exp(-a);
          break;
      }
    }
  }
  return phi;
}

inline bool key_visible(const std::optional<KeyMaskView>& mask, int64_t b, int64_t j) {
  return !mask || mask->at(b, j);
}

/// Batch b's key flags (1: the key takes part), nk of them; empty when there is no mask.
inline std::vector<uint8_t> head_mask(const std::optional<KeyMaskView>& mask, int64_t b,
                                      int64_t nk) {
  std::vector<uint8_t> flags;
  for (int64_t j = 0; mask && j < nk; ++j) flags.push_back(mask->at(b, j) ? 1 : 0);
  return flags;
}

/// Head (b, h) of a [B, H, N, X] view as N x X rows of T, row-major.
template <class T>
std::vector<T> head_rows(const TensorView& t, int64_t b, int64_t h) {
  std::vector<T> out;
  out.reserve(static_cast<size_t>(t.shape[2] * t.shape[3]));
  for (int64_t n = 0; n < t.shape[2]; ++n)
    for (int64_t x = 0; x < t.shape[3]; ++x) out.push_back(static_cast<T>(t.at(b, h, n, x)));
  return out;
}

/// Writes head (b, h) of t from its rows (the inverse of head_rows).
inline void put_head(DTensor& t, int64_t b, int64_t h, const std::vector<double>& rows) {
  const size_t offset = static_cast<size_t>((b * t.shape[1] + h) * t.shape[2] * t.shape[3]);
  std::copy(rows.begin(), rows.end(), t.values.begin() + static_cast<std::ptrdiff_t>(offset));
}

/// Zero dq, dk and dv for inputs of shape s (dw left empty).
inline DGrads zero_grads(const detail::AttentionShape& s) {
  auto zeros = [](const Shape4& shape) {
    return DTensor{
        shape, std::vector<double>(static_cast<size_t>(shape[0] * shape[1] * shape[2] * shape[3]))};
  };
  return DGrads{zeros({s.batch, s.heads, s.nq, s.d}),
                zeros({s.batch, s.heads, s.nk, s.d}),
                zeros({s.batch, s.heads, s.nk, s.dv}),
                {},
                {},
                {},
                {}};
}

/// Hybrid attention's sinks of batch row b: flags of its first `sinks` visible keys.
inline std::vector<uint8_t> sink_flags(const std::optional<KeyMaskView>& mask, int64_t b,
                                       int64_t nk, int64_t sinks) {
  std::vector<uint8_t> flags(static_cast<size_t>(nk), 0);
  for (int64_t j = 0, found = 0; j < nk && found < sinks; ++j)
    if (key_visible(mask, b, j)) {
      flags[j] = 1;
      ++found;
    }
  return flags;
}

/// gamma of head h (options.decay: none, one shared value, or one per head); 1 without decay.
inline double head_decay(const std::vector<double>& decay, int64_t h) {
  if (decay.empty()) return 1.0;
  return decay[decay.size() == 1 ? 0 : static_cast<size_t>(h)];
}

/// Materialised FAVOR attention in T with a feature map: [B, H, Nq, Dv] C-contiguous.
/// A_ij = phi(q_i).phi(k_j), zero where the key is masked or (causal) j > i, times
/// gamma_h^(i - j) with decay; y = A V / A 1 (rows with A 1 <= 0 or not finite: zeros).
/// The map gives kernel, scale and fit; o gives causal, the mask and the decay (checked by
/// the caller).
template <class T>
std::vector<T> favor_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                               const FeatureMap& fm, const AttentionOptions& o) {
  const int64_t B = q.shape[0], H = q.shape[1], nq = q.shape[2], nk = k.shape[2], dv = v.shape[3];
  const double scale = fm.scale ? *fm.scale : 1.0 / std::sqrt(static_cast<double>(q.shape[3]));
  const int64_t F = fm.features();
  const std::optional<KernelFit> fit = attention_fit(q, k, fm.kernel, fm.fit, o, scale);
  std::vector<T> out(static_cast<size_t>(B * H * nq * dv), T(0));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const auto pq = head_features<T>(q, b, h, fm, scale, fit);
      const auto pk = head_features<T>(k, b, h, fm, scale, fit);
      const T gamma = static_cast<T>(head_decay(o.decay, h));
      const std::vector<uint8_t> sink = sink_flags(o.key_mask, b, nk, o.sinks);
      for (int64_t i = 0; i < nq; ++i) {
        std::vector<T> num(static_cast<size_t>(dv), T(0));
        T den = 0;
        for (int64_t j = 0; j < nk; ++j) {
          if ((o.causal && j > i) || !key_visible(o.key_mask, b, j)) continue;
          T a = 0;
          if (sink[j] || (i - j < o.window && j - i < o.window)) {  // hybrid: exact terms
            for (int64_t t = 0; t < q.shape[3]; ++t)
              a += static_cast<T>(q.at(b, h, i, t)) * static_cast<T>(k.at(b, h, j, t));
            a = std::exp(static_cast<T>(scale) * a);
          } else {
            for (int64_t f = 0; f < F; ++f) a += pq[i * F + f] * pk[j * F + f];
            // decay from the window's edge (hybrid) or from the query (window 0)
            if (!o.decay.empty()) a *= std::pow(gamma, static_cast<T>(i - j - o.window));
          }
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

/// The same with a Projection: the map {w, o.kernel, o.scale, o.fit}.
template <class T>
std::vector<T> favor_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                               const Projection& w, const AttentionOptions& o) {
  return favor_attention<T>(q, k, v, detail::map_of(w, o), o);
}

}  // namespace favor::reference::naive
