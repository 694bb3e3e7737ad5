#pragma once
// The materialised FAVOR formula and its gradient for one head, on plain arrays of T
// (double for the oracle and finite differences, float for the naive-error yardstick).
// Features include every constant (math.md s.2); no stabilisation.
#include <cmath>
#include <cstdint>
#include <vector>

#include "favor/features.hpp"

namespace favor::reference::naive {

template <class T>
struct Head {
  int64_t nq, nk, d, dv, m;
  std::vector<T> q, k, v, w;  // nq x d, nk x d, nk x dv, m x d (row-major)
  std::vector<uint8_t> mask;  // nk flags (empty: all keys take part)
  std::vector<T> bias;        // FAVOR++ / FAVOR#: log bias per feature (w is then W_eff)
};

template <class T>
struct HeadGrads {
  std::vector<T> dq, dk, dv, dw;
  std::vector<T> dbias;  // m: the gradient of the log bias (of any shift added to a = W x)
};

// phi of the rows of x (n x d), times sqrt(scale) first: n x F.
template <class T>
std::vector<T> phi_rows(const std::vector<T>& x, int64_t n, int64_t d, const std::vector<T>& w,
                        int64_t m, Kernel kernel, T ss, const std::vector<T>& bias = {}) {
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
      }
    }
  }
  return out;
}

inline bool visible_key(const std::vector<uint8_t>& mask, int64_t j) {
  return mask.empty() || mask[j] != 0;
}

// A (nq x nk): phi(q_i).phi(k_j), zero where masked or (causal) j > i.
template <class T>
std::vector<T> kernel_matrix(const std::vector<T>& pq, const std::vector<T>& pk, const Head<T>& h,
                             int64_t F, bool causal) {
  std::vector<T> a(static_cast<size_t>(h.nq * h.nk), T(0));
  for (int64_t i = 0; i < h.nq; ++i)
    for (int64_t j = 0; j < h.nk; ++j) {
      if ((causal && j > i) || !visible_key(h.mask, j)) continue;
      T s = 0;
      for (int64_t f = 0; f < F; ++f) s += pq[i * F + f] * pk[j * F + f];
      a[i * h.nk + j] = s;
    }
  return a;
}

/// y (nq x dv) = A V / A 1; rows with a denominator <= 0 are zeros.
template <class T>
std::vector<T> forward(const Head<T>& h, Kernel kernel, T scale, bool causal) {
  const T ss = std::sqrt(scale);
  const int64_t F = feature_count(kernel, h.m);
  const auto a =
      kernel_matrix(phi_rows(h.q, h.nq, h.d, h.w, h.m, kernel, ss, h.bias),
                    phi_rows(h.k, h.nk, h.d, h.w, h.m, kernel, ss, h.bias), h, F, causal);
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

// d(phi rows)/d(inputs), chained: dx (n x d, before the sqrt(scale)), and dw and dbias
// accumulated.
template <class T>
void phi_backward(const std::vector<T>& x, const std::vector<T>& phi, const std::vector<T>& dphi,
                  int64_t n, int64_t d, const std::vector<T>& w, int64_t m, Kernel kernel, T ss,
                  std::vector<T>& dx, std::vector<T>& dw, std::vector<T>& dbias) {
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
    }
    // Norm term: exp(-|x|^2/2) (positive family) or exp(+|x|^2/2) (trig), x = ss q.
    const T sign = kernel == Kernel::trig ? T(1) : T(-1);
    for (int64_t t = 0; t < d; ++t) dx[i * d + t] += sign * total * ss * ss * x[i * d + t];
  }
}

/// Gradients of L = sum dy . y with respect to q, k, v, W (h.w) and the log bias.
template <class T>
HeadGrads<T> backward(const Head<T>& h, const std::vector<T>& dy, Kernel kernel, T scale,
                      bool causal) {
  const T ss = std::sqrt(scale);
  const int64_t F = feature_count(kernel, h.m);
  const auto pq = phi_rows(h.q, h.nq, h.d, h.w, h.m, kernel, ss, h.bias);
  const auto pk = phi_rows(h.k, h.nk, h.d, h.w, h.m, kernel, ss, h.bias);
  const auto a = kernel_matrix(pq, pk, h, F, causal);
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
      const T e = da[i * h.nk + j];
      if (e == T(0)) continue;
      for (int64_t f = 0; f < F; ++f) {
        dpq[i * F + f] += e * pk[j * F + f];
        dpk[j * F + f] += e * pq[i * F + f];
      }
    }
  phi_backward(h.q, pq, dpq, h.nq, h.d, h.w, h.m, kernel, ss, g.dq, g.dw, g.dbias);
  phi_backward(h.k, pk, dpk, h.nk, h.d, h.w, h.m, kernel, ss, g.dk, g.dw, g.dbias);
  return g;
}

}  // namespace favor::reference::naive
