#pragma once
// The materialised FAVOR formula and its gradient for one head, on plain arrays of T
// (double for the oracle and finite differences, float for the naive-error yardstick).
// Features include every constant (math.md s.2) and the feature weights lambda (on queries
// and keys, as feature_map.hpp writes phi); causal attention may decay, A_ij = phi(q_i).phi(k_j)
// gamma^(i-j). No stabilisation. map_backward assembles the heads of a FeatureMap call.
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "favor/feature_map.hpp"
#include "favor/features.hpp"
#include "reference/naive.hpp"

namespace favor::reference::naive {

template <class T>
struct Head {
  int64_t nq, nk, d, dv, m;
  std::vector<T> q, k, v, w;   // nq x d, nk x d, nk x dv, m x d (row-major)
  std::vector<uint8_t> mask;   // nk flags (empty: all keys take part)
  std::vector<T> bias;         // m, added to a = W x: FAVOR++ / FAVOR# log bias (w is then
                               // W_eff) or a learned map's b; empty: 0
  std::vector<T> lambda = {};  // m feature weights (phi_f times lambda_f), or empty (1)
  T gamma = T(1);              // causal decay gamma^(i-j); 1: none
};

template <class T>
struct HeadGrads {
  std::vector<T> dq, dk, dv, dw;
  std::vector<T> dbias;    // m: the gradient of the log bias (of any shift added to a = W x)
  std::vector<T> dlambda;  // m when h.lambda is set
  T dgamma = T(0);         // dL/dgamma (causal; also at gamma = 1)
};

// phi of the rows of x (n x d), times sqrt(scale) first: n x F; row f's features times
// lambda_f when lambda is set.
template <class T>
std::vector<T> phi_rows(const std::vector<T>& x, int64_t n, int64_t d, const std::vector<T>& w,
                        int64_t m, Kernel kernel, T ss, const std::vector<T>& bias = {},
                        const std::vector<T>& lambda = {}) {
  const int64_t F = feature_count(kernel, m);
  std::vector<T> out(static_cast<size_t>(n * F));
  for (int64_t i = 0; i < n; ++i) {
    T n2 = 0;
    for (int64_t t = 0; t < d; ++t) n2 += (ss * x[i * d + t]) * (ss * x[i * d + t]);
    for (int64_t f = 0; f < m; ++f) {
      T a = bias.empty() ? T(0) : bias[f];
      for (int64_t t = 0; t < d; ++t) a += w[f * d + t] * ss * x[i * d + t];
      T* row = out.data() + i * F;
      switch (kernel) {
        case Kernel::positive:
        case Kernel::favorpp:  // with W_eff and the bias; the constant cancels in y
        case Kernel::favorsharp:
          row[f] = std::exp(a - n2 / 2) / std::sqrt(T(m));
          break;
        case Kernel::trig:
          row[f] = std::exp(n2 / 2) / std::sqrt(T(m)) * std::sin(a);
          row[m + f] = std::exp(n2 / 2) / std::sqrt(T(m)) * std::cos(a);
          break;
        case Kernel::hyperbolic:
          row[f] = std::exp(a - n2 / 2) / std::sqrt(T(2 * m));
          row[m + f] = std::exp(-a - n2 / 2) / std::sqrt(T(2 * m));
          break;
        case Kernel::hedgehog:
          row[f] = std::exp(a);
          row[m + f] = std::exp(-a);
          break;
      }
      if (!lambda.empty()) {
        row[f] *= lambda[f];
        if (F == 2 * m) row[m + f] *= lambda[f];
      }
    }
  }
  return out;
}

inline bool visible_key(const std::vector<uint8_t>& mask, int64_t j) {
  return mask.empty() || mask[j] != 0;
}

// The decay factor gamma^(i-j) of A_ij (1 bidirectional or without decay).
template <class T>
T decay_factor(const Head<T>& h, bool causal, int64_t i, int64_t j) {
  return causal && h.gamma != T(1) ? std::pow(h.gamma, static_cast<T>(i - j)) : T(1);
}

// A (nq x nk): phi(q_i).phi(k_j) gamma^(i-j) (the decay with `decayed`), zero where masked or
// (causal) j > i.
template <class T>
std::vector<T> kernel_matrix(const std::vector<T>& pq, const std::vector<T>& pk, const Head<T>& h,
                             int64_t F, bool causal, bool decayed = true) {
  std::vector<T> a(static_cast<size_t>(h.nq * h.nk), T(0));
  for (int64_t i = 0; i < h.nq; ++i)
    for (int64_t j = 0; j < h.nk; ++j) {
      if ((causal && j > i) || !visible_key(h.mask, j)) continue;
      T s = 0;
      for (int64_t f = 0; f < F; ++f) s += pq[i * F + f] * pk[j * F + f];
      a[i * h.nk + j] = decayed ? s * decay_factor(h, causal, i, j) : s;
    }
  return a;
}

/// y (nq x dv) = A V / A 1; rows with a denominator <= 0 are zeros.
template <class T>
std::vector<T> forward(const Head<T>& h, Kernel kernel, T scale, bool causal) {
  const T ss = std::sqrt(scale);
  const int64_t F = feature_count(kernel, h.m);
  const auto a =
      kernel_matrix(phi_rows(h.q, h.nq, h.d, h.w, h.m, kernel, ss, h.bias, h.lambda),
                    phi_rows(h.k, h.nk, h.d, h.w, h.m, kernel, ss, h.bias, h.lambda), h, F, causal);
  std::vector<T> y(static_cast<size_t>(h.nq * h.dv), T(0));
  for (int64_t i = 0; i < h.nq; ++i) {
    T den = 0;
    for (int64_t j = 0; j < h.nk; ++j) den += a[i * h.nk + j];
    if (!(den > 0)) continue;
    for (int64_t j = 0; j < h.nk; ++j)
      for (int64_t x = 0; x < h.dv; ++x)
        y[i * h.dv + x] += a[i * h.nk + j] * h.v[j * h.dv + x] / den;
  }
  return y;
}

// d(phi rows)/d(inputs), chained: dx (n x d, before the sqrt(scale)), and dw, dbias and
// (when lambda is set) dlambda accumulated. phi includes lambda, a constant factor of row f's
// features: d/da and the norm term are unchanged, and dL/dlambda_f = sum dphi phi / lambda_f
// over the features of row f.
template <class T>
void phi_backward(const std::vector<T>& x, const std::vector<T>& phi, const std::vector<T>& dphi,
                  int64_t n, int64_t d, const std::vector<T>& w, int64_t m, Kernel kernel, T ss,
                  std::vector<T>& dx, std::vector<T>& dw, std::vector<T>& dbias,
                  const std::vector<T>& lambda = {}, std::vector<T>* dlambda = nullptr) {
  const int64_t F = feature_count(kernel, m);
  dx.assign(static_cast<size_t>(n * d), T(0));
  for (int64_t i = 0; i < n; ++i) {
    const T* p = phi.data() + i * F;
    const T* dp = dphi.data() + i * F;
    T total = 0;  // sum_f dphi_f phi_f: the gradient through the norm term
    for (int64_t f = 0; f < F; ++f) total += dp[f] * p[f];
    for (int64_t f = 0; f < m; ++f) {
      T coef = 0;  // d/da_f of sum dphi . phi
      switch (kernel) {
        case Kernel::positive:
        case Kernel::favorpp:
        case Kernel::favorsharp:
          coef = dp[f] * p[f];
          break;
        case Kernel::hyperbolic:
        case Kernel::hedgehog:
          coef = dp[f] * p[f] - dp[m + f] * p[m + f];
          break;
        case Kernel::trig:
          coef = dp[f] * p[m + f] - dp[m + f] * p[f];
          break;
      }
      for (int64_t t = 0; t < d; ++t) {
        dx[i * d + t] += coef * w[f * d + t] * ss;
        dw[f * d + t] += coef * ss * x[i * d + t];
      }
      dbias[f] += coef;
      if (!lambda.empty() && dlambda) {
        const T both = dp[f] * p[f] + (F == 2 * m ? dp[m + f] * p[m + f] : T(0));
        (*dlambda)[f] += both / lambda[f];
      }
    }
    // Norm term: exp(-|x|^2/2) (positive family), exp(+|x|^2/2) (trig) or none (hedgehog),
    // x = ss q.
    const T sign = kernel == Kernel::trig ? T(1) : kernel == Kernel::hedgehog ? T(0) : T(-1);
    for (int64_t t = 0; t < d; ++t) dx[i * d + t] += sign * total * ss * ss * x[i * d + t];
  }
}

/// Gradients of L = sum dy . y with respect to q, k, v, W (h.w), the log bias, lambda and the
/// decay. With A_ij = K_ij gamma^(i-j): dK_ij = dA_ij gamma^(i-j) and
/// dL/dgamma = sum_{j<i} dA_ij K_ij (i-j) gamma^(i-j-1).
template <class T>
HeadGrads<T> backward(const Head<T>& h, const std::vector<T>& dy, Kernel kernel, T scale,
                      bool causal) {
  const T ss = std::sqrt(scale);
  const int64_t F = feature_count(kernel, h.m);
  const auto pq = phi_rows(h.q, h.nq, h.d, h.w, h.m, kernel, ss, h.bias, h.lambda);
  const auto pk = phi_rows(h.k, h.nk, h.d, h.w, h.m, kernel, ss, h.bias, h.lambda);
  const auto a = kernel_matrix(pq, pk, h, F, causal);
  const auto kern = kernel_matrix(pq, pk, h, F, causal, false);
  HeadGrads<T> g;
  g.dv.assign(static_cast<size_t>(h.nk * h.dv), T(0));
  g.dw.assign(static_cast<size_t>(h.m * h.d), T(0));
  g.dbias.assign(static_cast<size_t>(h.m), T(0));
  std::vector<T> da(static_cast<size_t>(h.nq * h.nk), T(0));
  for (int64_t i = 0; i < h.nq; ++i) {
    T den = 0;
    for (int64_t j = 0; j < h.nk; ++j) den += a[i * h.nk + j];
    if (!(den > 0)) continue;
    std::vector<T> y(static_cast<size_t>(h.dv), T(0));
    for (int64_t j = 0; j < h.nk; ++j)
      for (int64_t x = 0; x < h.dv; ++x) y[x] += a[i * h.nk + j] * h.v[j * h.dv + x] / den;
    T gy = 0;
    for (int64_t x = 0; x < h.dv; ++x) gy += dy[i * h.dv + x] * y[x];
    for (int64_t j = 0; j < h.nk; ++j) {
      if (a[i * h.nk + j] == T(0) && ((causal && j > i) || !visible_key(h.mask, j))) continue;
      T dot = 0;
      for (int64_t x = 0; x < h.dv; ++x) {
        dot += dy[i * h.dv + x] * h.v[j * h.dv + x];
        g.dv[j * h.dv + x] += a[i * h.nk + j] * dy[i * h.dv + x] / den;
      }
      da[i * h.nk + j] = (dot - gy) / den;
    }
  }
  std::vector<T> dpq(static_cast<size_t>(h.nq * F), T(0)), dpk(static_cast<size_t>(h.nk * F), T(0));
  for (int64_t i = 0; i < h.nq; ++i)
    for (int64_t j = 0; j < h.nk; ++j) {
      if (da[i * h.nk + j] == T(0)) continue;
      const T e = da[i * h.nk + j] * decay_factor(h, causal, i, j);
      if (causal && j < i) {
        g.dgamma += da[i * h.nk + j] * kern[i * h.nk + j] * static_cast<T>(i - j) *
                    std::pow(h.gamma, static_cast<T>(i - j - 1));
      }
      for (int64_t f = 0; f < F; ++f) {
        dpq[i * F + f] += e * pk[j * F + f];
        dpk[j * F + f] += e * pq[i * F + f];
      }
    }
  if (!h.lambda.empty()) g.dlambda.assign(static_cast<size_t>(h.m), T(0));
  phi_backward(h.q, pq, dpq, h.nq, h.d, h.w, h.m, kernel, ss, g.dq, g.dw, g.dbias, h.lambda,
               &g.dlambda);
  phi_backward(h.k, pk, dpk, h.nk, h.d, h.w, h.m, kernel, ss, g.dk, g.dw, g.dbias, h.lambda,
               &g.dlambda);
  return g;
}

/// The gradients of a FeatureMap call (reference::favor_attention with a map), in T, laid out
/// as AttentionGrads: dq, dk, dv [B, H, N, X] in C order; dw [heads][m][d] when map.weights is
/// set, else dL/dW of the shared projection (m x d; FAVOR++ / FAVOR# through head_map_backward,
/// the fit held fixed); dbias and dlambda [heads][m] when the map has them; ddecay one per
/// value of o.decay. Set s = bh % map.heads sums the gradients of every head bh that uses it.
template <class T>
struct MapGrads {
  std::vector<T> dq, dk, dv, dw, dbias, dlambda, ddecay;
};

/// map_backward for inputs already checked, with the call's scale and fit (attention_fit).
template <class T>
MapGrads<T> map_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& dy, const FeatureMap& map, const AttentionOptions& o,
                         double scale, const std::optional<KernelFit>& fit) {
  const int64_t B = q.shape[0], H = q.shape[1], nq = q.shape[2], nk = k.shape[2], d = q.shape[3],
                dv = v.shape[3], m = map.m(), sets = map.heads;
  const auto slice = [](const std::vector<float>& values, int64_t set, int64_t size) {
    return std::vector<T>(values.begin() + set * size, values.begin() + (set + 1) * size);
  };
  const auto add = [](std::vector<T>& dst, int64_t set, const std::vector<T>& src) {
    for (size_t i = 0; i < src.size(); ++i) dst[set * src.size() + i] += src[i];
  };
  const auto append = [](std::vector<T>& dst, const std::vector<T>& src) {
    dst.insert(dst.end(), src.begin(), src.end());
  };
  MapGrads<T> g;
  g.dw.assign(static_cast<size_t>((map.weights.empty() ? 1 : sets) * m * d), T(0));
  if (!map.bias.empty()) g.dbias.assign(static_cast<size_t>(sets * m), T(0));
  if (!map.lambda.empty()) g.dlambda.assign(static_cast<size_t>(sets * m), T(0));
  g.ddecay.assign(o.decay.size(), T(0));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t bh = b * H + h, set = bh % sets;
      // W_h: the learned projection of the head's set, the shared one or (FAVOR++ / FAVOR#)
      // the fitted transform of it with its log bias; b_h and lambda_h when the map has them.
      const HeadMap hm = head_map(map.projection, map.kernel, fit, bh);
      Head<T> head{nq,
                   nk,
                   d,
                   dv,
                   m,
                   head_rows<T>(q, b, h),
                   head_rows<T>(k, b, h),
                   head_rows<T>(v, b, h),
                   std::vector<T>(hm.w.begin(), hm.w.end()),
                   head_mask(o.key_mask, b, nk),
                   {},
                   {},
                   T(1)};
      if (!map.weights.empty()) head.w = slice(map.weights, set, m * d);
      if (!map.bias.empty()) head.bias = slice(map.bias, set, m);
      if (data_adapted(map.kernel)) head.bias.assign(hm.bias.begin(), hm.bias.end());
      if (!map.lambda.empty()) head.lambda = slice(map.lambda, set, m);
      const size_t decay_set = o.decay.size() == 1 ? 0 : static_cast<size_t>(h);
      if (!o.decay.empty()) head.gamma = static_cast<T>(o.decay[decay_set]);
      const auto hg =
          backward(head, head_rows<T>(dy, b, h), map.kernel, static_cast<T>(scale), o.causal);
      append(g.dq, hg.dq);
      append(g.dk, hg.dk);
      append(g.dv, hg.dv);
      if (!map.weights.empty()) {
        add(g.dw, set, hg.dw);
      } else {
        head_map_backward(map.projection, map.kernel, fit, bh, hg.dw, hg.dbias, g.dw);
      }
      if (!map.bias.empty()) add(g.dbias, set, hg.dbias);
      if (!map.lambda.empty()) add(g.dlambda, set, hg.dlambda);
      if (!o.decay.empty()) g.ddecay[decay_set] += hg.dgamma;
    }
  return g;
}

}  // namespace favor::reference::naive
