#pragma once
// Materialised Transformer-VQ attention and its gradient (math.md s.6), templated on the
// arithmetic type: vq_reference*.cpp expose the double instantiation as favor::reference;
// tests also use the float one, a naive same-precision implementation, to bound the fast
// kernels' rounding error (docs/numerics.md). Both VQ forms are one formula, per head:
// W_ij = sum_s exp(l_is) p_js with logits l_is = scale q_i.C_s and key weights
// p_j = one-hot(z_j) (hard, z the nearest codes) or softmax_s(-|k_j - C_s|^2 / tau) (soft);
// y_i = sum_j W_ij v_j / sum_j W_ij over the visible keys (mask, causal j <= i). Hard VQ is
// then softmax attention over the quantised keys C_{z_j}. O(Nq Nk c): tests only.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "favor/tensor.hpp"
#include "favor/vq.hpp"
#include "reference/naive.hpp"

namespace favor::reference::vq_naive {

template <class T>
struct Head {
  int64_t nq, nk, d, dv, c;
  std::vector<T> q, k, v, C;  // nq x d, nk x d, nk x dv, c x d (row-major)
  std::vector<uint8_t> mask;  // nk flags (empty: all keys take part)
  std::vector<int32_t> z;     // hard VQ: the code of every key; empty for soft VQ
  T tau;                      // soft VQ temperature (unused when z is given)
};

template <class T>
struct HeadGrads {
  std::vector<T> dq, dk, dv, dc;  // dk: straight-through dL/dk^ for hard VQ
};

/// Nearest code of each of n rows x (n x d) in double whatever T, so that the float
/// instantiation quantises as the oracle does; ties go to the lowest index.
template <class T>
std::vector<int32_t> nearest(const std::vector<T>& x, int64_t n, int64_t d, const std::vector<T>& C,
                             int64_t c) {
  std::vector<int32_t> z(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    double best = std::numeric_limits<double>::infinity();
    for (int64_t s = 0; s < c; ++s) {
      double dist = 0;
      for (int64_t t = 0; t < d; ++t) {
        const double e = double(x[j * d + t]) - double(C[s * d + t]);
        dist += e * e;
      }
      if (dist < best) best = dist, z[j] = static_cast<int32_t>(s);
    }
  }
  return z;
}

/// Head (b, h) of the tensors in T: codebook h (or the shared one), batch b's key flags,
/// and for hard VQ (tau = 0) the nearest codes.
template <class T>
Head<T> head_of(const TensorView& q, const TensorView& k, const TensorView& v,
                const TensorView& codebook, const VQOptions& o, int64_t b, int64_t h) {
  const int64_t nk = k.shape[2], d = k.shape[3], c = codebook.shape[2];
  Head<T> head{q.shape[2],
               nk,
               d,
               v.shape[3],
               c,
               naive::head_rows<T>(q, b, h),
               naive::head_rows<T>(k, b, h),
               naive::head_rows<T>(v, b, h),
               naive::head_rows<T>(codebook, 0, codebook.shape[1] == 1 ? 0 : h),
               naive::head_mask(o.key_mask, b, nk),
               {},
               static_cast<T>(o.tau)};
  if (o.tau == 0.0) head.z = nearest(head.k, nk, d, head.C, c);
  return head;
}

/// Key weights p (nk x c): one-hot rows (hard) or the soft assignment; zero rows for
/// masked keys.
template <class T>
std::vector<T> key_weights(const Head<T>& h) {
  std::vector<T> p(static_cast<size_t>(h.nk * h.c), T(0));
  for (int64_t j = 0; j < h.nk; ++j) {
    if (!h.mask.empty() && !h.mask[j]) continue;
    T* row = p.data() + j * h.c;
    if (!h.z.empty()) {
      row[h.z[j]] = T(1);
      continue;
    }
    T top = -std::numeric_limits<T>::infinity();
    for (int64_t s = 0; s < h.c; ++s) {
      T dist = 0;
      for (int64_t t = 0; t < h.d; ++t)
        dist += (h.k[j * h.d + t] - h.C[s * h.d + t]) * (h.k[j * h.d + t] - h.C[s * h.d + t]);
      row[s] = -dist / h.tau;
      top = std::max(top, row[s]);
    }
    T sum = 0;
    for (int64_t s = 0; s < h.c; ++s) sum += (row[s] = std::exp(row[s] - top));
    for (int64_t s = 0; s < h.c; ++s) row[s] /= sum;
  }
  return p;
}

// e_is = exp(l_is - m_i) (nq x c). The shift is for range only. Soft: m_i = max_s l_is, so
// e <= 1. Hard: m_i is the largest logit of the codes of the keys row i sees, and the other
// codes get e = 0 (they carry no key weight, and their exp could overflow): W_ij, the
// largest e of a visible key, is then 1.
template <class T>
std::vector<T> query_weights(const Head<T>& h, T scale, bool causal) {
  const bool hard = !h.z.empty();
  std::vector<T> e(static_cast<size_t>(h.nq * h.c));
  std::vector<uint8_t> live(static_cast<size_t>(h.c), hard ? 0 : 1);
  for (int64_t i = 0; i < h.nq; ++i) {
    for (int64_t j = 0; hard && j < h.nk && !(causal && j > i); ++j)
      if (h.mask.empty() || h.mask[j]) live[h.z[j]] = 1;
    T top = -std::numeric_limits<T>::infinity();
    for (int64_t s = 0; s < h.c; ++s) {
      T l = 0;
      for (int64_t t = 0; t < h.d; ++t) l += h.q[i * h.d + t] * h.C[s * h.d + t];
      e[i * h.c + s] = scale * l;
      if (live[s]) top = std::max(top, scale * l);
    }
    for (int64_t s = 0; s < h.c; ++s)
      e[i * h.c + s] = live[s] ? std::exp(e[i * h.c + s] - top) : T(0);
  }
  return e;
}

// W (nq x nk) = e p^T, zero where the key is invisible to the query.
template <class T>
std::vector<T> weights(const Head<T>& h, const std::vector<T>& e, const std::vector<T>& p,
                       bool causal) {
  std::vector<T> w(static_cast<size_t>(h.nq * h.nk), T(0));
  for (int64_t i = 0; i < h.nq; ++i)
    for (int64_t j = 0; j < h.nk && !(causal && j > i); ++j) {
      T a = 0;
      for (int64_t s = 0; s < h.c; ++s) a += e[i * h.c + s] * p[j * h.c + s];
      w[i * h.nk + j] = a;
    }
  return w;
}

/// y (nq x dv); rows with no visible key are zeros.
template <class T>
std::vector<T> forward(const Head<T>& h, T scale, bool causal) {
  const auto w = weights(h, query_weights(h, scale, causal), key_weights(h), causal);
  std::vector<T> y(static_cast<size_t>(h.nq * h.dv), T(0));
  for (int64_t i = 0; i < h.nq; ++i) {
    T den = 0;
    T* yi = y.data() + i * h.dv;
    for (int64_t j = 0; j < h.nk; ++j) {
      den += w[i * h.nk + j];
      for (int64_t x = 0; x < h.dv; ++x) yi[x] += w[i * h.nk + j] * h.v[j * h.dv + x];
    }
    if (den > 0) {
      for (int64_t x = 0; x < h.dv; ++x) yi[x] /= den;
    } else {  // no visible key: zeros
      std::fill(yi, yi + h.dv, T(0));
    }
  }
  return y;
}

/// Gradients of L = sum dy . y. Hard VQ: dk = dL/dk^ (softmax attention over the quantised
/// keys) and dC_s = sum_{j: z_j = s} dk^_j. Soft VQ: dk and dC exact, dC through the logits
/// and through p(s|k).
template <class T>
HeadGrads<T> backward(const Head<T>& h, const std::vector<T>& dy, T scale, bool causal) {
  const auto e = query_weights(h, scale, causal);
  const auto p = key_weights(h);
  const auto w = weights(h, e, p, causal);
  const int64_t c = h.c, d = h.d, dv = h.dv;
  HeadGrads<T> g;
  g.dq.assign(static_cast<size_t>(h.nq * d), T(0));
  g.dk.assign(static_cast<size_t>(h.nk * d), T(0));
  g.dv.assign(static_cast<size_t>(h.nk * dv), T(0));
  g.dc.assign(static_cast<size_t>(c * d), T(0));
  std::vector<T> dl(static_cast<size_t>(c)), dp(static_cast<size_t>(h.nk * c), T(0));
  for (int64_t i = 0; i < h.nq; ++i) {
    const T* wi = w.data() + i * h.nk;
    T den = 0;
    for (int64_t j = 0; j < h.nk; ++j) den += wi[j];
    if (!(den > 0)) continue;  // no visible key: y_i = 0 whatever the inputs
    std::vector<T> y(static_cast<size_t>(dv), T(0));
    for (int64_t j = 0; j < h.nk; ++j)
      for (int64_t x = 0; x < dv; ++x) y[x] += wi[j] / den * h.v[j * dv + x];
    T delta = 0;
    for (int64_t x = 0; x < dv; ++x) delta += dy[i * dv + x] * y[x];
    std::fill(dl.begin(), dl.end(), T(0));
    for (int64_t j = 0; j < h.nk; ++j) {
      if (wi[j] == T(0)) continue;  // invisible (or a zero weight: contributes nothing)
      T dot = 0;
      for (int64_t x = 0; x < dv; ++x) dot += dy[i * dv + x] * h.v[j * dv + x];
      const T dw = (dot - delta) / den;  // dL/dW_ij
      for (int64_t x = 0; x < dv; ++x) g.dv[j * dv + x] += wi[j] / den * dy[i * dv + x];
      for (int64_t s = 0; s < c; ++s) {
        dl[s] += dw * e[i * c + s] * p[j * c + s];
        dp[j * c + s] += dw * e[i * c + s];
      }
      if (!h.z.empty()) {  // dW_ij / dk^_j = scale W_ij q_i
        for (int64_t t = 0; t < d; ++t) g.dk[j * d + t] += scale * dw * wi[j] * h.q[i * d + t];
      }
    }
    for (int64_t s = 0; s < c; ++s)
      for (int64_t t = 0; t < d; ++t) {
        g.dq[i * d + t] += scale * dl[s] * h.C[s * d + t];
        if (h.z.empty()) g.dc[s * d + t] += scale * dl[s] * h.q[i * d + t];
      }
  }
  if (!h.z.empty()) {
    for (int64_t j = 0; j < h.nk; ++j)
      for (int64_t t = 0; t < d; ++t) g.dc[h.z[j] * d + t] += g.dk[j * d + t];
    return g;
  }
  // Soft: log p_js = -|k_j - C_s|^2 / tau - lse_j, so dE_js = p_js (dp_js - sum_t p_jt dp_jt)
  // and d(-|k - C|^2 / tau) = (2 / tau) (C - k) dk + (2 / tau) (k - C) dC.
  for (int64_t j = 0; j < h.nk; ++j) {
    T mean = 0;
    for (int64_t s = 0; s < c; ++s) mean += p[j * c + s] * dp[j * c + s];
    for (int64_t s = 0; s < c; ++s) {
      const T de = p[j * c + s] * (dp[j * c + s] - mean) * 2 / h.tau;
      for (int64_t t = 0; t < d; ++t) {
        const T diff = h.k[j * d + t] - h.C[s * d + t];
        g.dk[j * d + t] -= de * diff;
        g.dc[s * d + t] += de * diff;
      }
    }
  }
  return g;
}

}  // namespace favor::reference::vq_naive

namespace favor::reference::naive {

/// Codebook g's code s, coordinate x (g = h, or 0 for a shared codebook).
inline float code_at(const TensorView& codebook, int64_t h, int64_t s, int64_t x) {
  return codebook.at(0, codebook.shape[1] == 1 ? 0 : h, s, x);
}

/// |k_j - C_s|^2 in T for key j of head (b, h).
template <class T>
T distance2(const TensorView& k, const TensorView& codebook, int64_t b, int64_t h, int64_t j,
            int64_t s) {
  T sum = 0;
  for (int64_t x = 0; x < k.shape[3]; ++x) {
    const T diff = static_cast<T>(k.at(b, h, j, x)) - static_cast<T>(code_at(codebook, h, s, x));
    sum += diff * diff;
  }
  return sum;
}

/// Nearest code of every key, in double (ties to the lowest index): [B*H*Nk], C order.
inline std::vector<int32_t> nearest_codes(const TensorView& k, const TensorView& codebook) {
  std::vector<int32_t> z;
  z.reserve(static_cast<size_t>(k.numel() / k.shape[3]));
  for (int64_t b = 0; b < k.shape[0]; ++b)
    for (int64_t h = 0; h < k.shape[1]; ++h) {
      const auto C = head_rows<double>(codebook, 0, codebook.shape[1] == 1 ? 0 : h);
      const auto zh = vq_naive::nearest(head_rows<double>(k, b, h), k.shape[2], k.shape[3], C,
                                        codebook.shape[2]);
      z.insert(z.end(), zh.begin(), zh.end());
    }
  return z;
}

/// VQ attention [B, H, Nq, Dv] in T, C order (vq_naive::forward per head). `scale`
/// resolved by the caller.
template <class T>
std::vector<T> vq_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& codebook, const VQOptions& o, double scale) {
  std::vector<T> out;
  out.reserve(static_cast<size_t>(q.shape[0] * q.shape[1] * q.shape[2] * v.shape[3]));
  for (int64_t b = 0; b < q.shape[0]; ++b)
    for (int64_t h = 0; h < q.shape[1]; ++h) {
      const auto y = vq_naive::forward(vq_naive::head_of<T>(q, k, v, codebook, o, b, h),
                                       static_cast<T>(scale), o.causal);
      out.insert(out.end(), y.begin(), y.end());
    }
  return out;
}

}  // namespace favor::reference::naive
