#pragma once
// Naive materialised Transformer-VQ attention (math.md s.6), templated on the arithmetic
// type. vq_reference.cpp exposes the double instantiation as favor::reference; tests also
// use the float one, a naive same-precision implementation, to bound the fast kernels'
// rounding error (docs/numerics.md).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "favor/tensor.hpp"
#include "favor/vq.hpp"

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

/// Nearest code of every key, in T (ties to the lowest index): [B*H*Nk], C order.
template <class T>
std::vector<int32_t> nearest_codes(const TensorView& k, const TensorView& codebook) {
  std::vector<int32_t> z;
  z.reserve(static_cast<size_t>(k.numel() / k.shape[3]));
  for (int64_t b = 0; b < k.shape[0]; ++b)
    for (int64_t h = 0; h < k.shape[1]; ++h)
      for (int64_t j = 0; j < k.shape[2]; ++j) {
        int32_t best = 0;
        T best_d = distance2<T>(k, codebook, b, h, j, 0);
        for (int64_t s = 1; s < codebook.shape[2]; ++s) {
          const T dist = distance2<T>(k, codebook, b, h, j, s);
          if (dist < best_d) {
            best_d = dist;
            best = static_cast<int32_t>(s);
          }
        }
        z.push_back(best);
      }
  return z;
}

/// VQ attention [B, H, Nq, Dv] in T, C order. `scale` resolved by the caller. Hard: softmax
/// over the quantised keys C_{z_j}; soft: A_ij = sum_s exp(scale q_i.C_s - max) p(s|k_j).
template <class T>
std::vector<T> vq_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& codebook, const VQOptions& o, double scale) {
  const int64_t B = q.shape[0], H = q.shape[1], nq = q.shape[2], nk = k.shape[2];
  const int64_t d = q.shape[3], dv = v.shape[3], c = codebook.shape[2];
  const T inf = std::numeric_limits<T>::infinity();
  const bool hard = o.tau == 0.0;
  const std::vector<int32_t> z = hard ? nearest_codes<T>(k, codebook) : std::vector<int32_t>{};
  std::vector<T> out(static_cast<size_t>(B * H * nq * dv), T(0));
  std::vector<T> prob(static_cast<size_t>(nk * c)), logit(static_cast<size_t>(c));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      if (!hard) {  // p(s|k_j) = softmax_s(-|k_j - C_s|^2 / tau), max-subtracted
        for (int64_t j = 0; j < nk; ++j) {
          T* pj = prob.data() + j * c;
          T top = -inf, sum = 0;
          for (int64_t s = 0; s < c; ++s) {
            pj[s] = -distance2<T>(k, codebook, b, h, j, s) / static_cast<T>(o.tau);
            top = std::max(top, pj[s]);
          }
          for (int64_t s = 0; s < c; ++s) sum += pj[s] = std::exp(pj[s] - top);
          for (int64_t s = 0; s < c; ++s) pj[s] /= sum;
        }
      }
      for (int64_t i = 0; i < nq; ++i) {
        T top = -inf;
        for (int64_t s = 0; s < c; ++s) {
          T dot = 0;
          for (int64_t x = 0; x < d; ++x)
            dot += static_cast<T>(q.at(b, h, i, x)) * static_cast<T>(code_at(codebook, h, s, x));
          logit[s] = static_cast<T>(scale) * dot;
        }
        // The shift is for range only: hard, the largest visible logit; soft, the largest
        // code logit (the weights are then exp(logit - top) <= 1 per code).
        auto visible = [&](int64_t j) {
          return !(o.causal && j > i) && (!o.key_mask || o.key_mask->at(b, j));
        };
        const int32_t* zh = hard ? z.data() + (b * H + h) * nk : nullptr;
        if (hard) {
          for (int64_t j = 0; j < nk; ++j)
            if (visible(j)) top = std::max(top, logit[zh[j]]);
        } else {
          top = *std::max_element(logit.begin(), logit.end());
        }
        for (int64_t s = 0; s < c; ++s) logit[s] = std::exp(logit[s] - top);
        T den = 0;
        T* dst = out.data() + ((b * H + h) * nq + i) * dv;
        for (int64_t j = 0; j < nk; ++j) {
          if (!visible(j)) continue;
          T a = 0;
          if (hard) a = logit[zh[j]];
          for (int64_t s = 0; !hard && s < c; ++s) a += logit[s] * prob[j * c + s];
          den += a;
          for (int64_t x = 0; x < dv; ++x) dst[x] += a * static_cast<T>(v.at(b, h, j, x));
        }
        if (den > 0) {
          for (int64_t x = 0; x < dv; ++x) dst[x] /= den;
        } else {  // no visible key: zeros
          std::fill(dst, dst + dv, T(0));
        }
      }
    }
  return out;
}

}  // namespace favor::reference::naive
