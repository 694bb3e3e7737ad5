#pragma once
// Shared test helpers: reproducible inputs and comparisons against the reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/rng.hpp"
#include "favor/favor.hpp"

namespace favor::testing {

/// [B, H, N, D] with N(0,1) entries; if norm > 0 each row is rescaled to a norm drawn
/// uniformly from [norm/2, 3 norm/2] (rows of different norms: per-key weights matter).
inline Tensor random_tensor(const Shape4& shape, uint64_t seed, double norm = 0.0) {
  Tensor t(shape);
  detail::Rng rng(seed, 12345);
  for (float& x : t.values()) x = static_cast<float>(rng.normal());
  if (norm > 0.0) {
    const int64_t d = shape[3];
    for (int64_t r = 0; r < t.numel() / d; ++r) {
      double n2 = 0.0;
      for (int64_t x = 0; x < d; ++x) n2 += double(t.data()[r * d + x]) * t.data()[r * d + x];
      const double f = norm * (0.5 + rng.uniform_open()) / std::sqrt(n2);
      for (int64_t x = 0; x < d; ++x)
        t.data()[r * d + x] = static_cast<float>(t.data()[r * d + x] * f);
    }
  }
  return t;
}

/// Key-mask flags for n keys: key j is masked out when j % period == dropped.
inline std::vector<uint8_t> periodic_mask(size_t n, size_t period, size_t dropped) {
  std::vector<uint8_t> mask(n);
  for (size_t j = 0; j < n; ++j) mask[j] = j % period != dropped;
  return mask;
}

/// Relative Frobenius error of a float tensor against a double vector (same layout).
inline double rel_error(const Tensor& approx, const std::vector<double>& exact) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < exact.size(); ++i) {
    diff += (approx.values()[i] - exact[i]) * (approx.values()[i] - exact[i]);
    norm += exact[i] * exact[i];
  }
  return std::sqrt(diff / norm);
}

inline double rel_error(const std::vector<float>& approx, const std::vector<double>& exact) {
  Tensor t({1, 1, 1, static_cast<int64_t>(approx.size())}, approx);
  return rel_error(t, exact);
}

/// Max over elements of |a - b| / max(|b|, floor).
inline double max_rel_diff(const Tensor& a, const Tensor& b, double floor = 1e-30) {
  double worst = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double e = std::abs(double(a.values()[i]) - b.values()[i]);
    worst = std::max(worst, e / std::max(std::abs(double(b.values()[i])), floor));
  }
  return worst;
}

/// Worst error of features `fast` against the double reference features `exact` (shape
/// [..., F]): per entry relative to the entry itself, or, with `per_row_amplitude`, to the
/// row's largest entry (trig features: sin and cos cross zero).
inline double worst_feature_error(const Tensor& fast, const reference::DTensor& exact,
                                  bool per_row_amplitude) {
  const int64_t F = exact.shape[3];
  double worst = 0;
  for (size_t row = 0; row < exact.values.size() / F; ++row) {
    double amplitude = 0;
    for (int64_t f = 0; f < F; ++f)
      amplitude = std::max(amplitude, std::abs(exact.values[row * F + f]));
    for (int64_t f = 0; f < F; ++f) {
      const double e = exact.values[row * F + f];
      const double denom = per_row_amplitude ? amplitude : std::abs(e);
      worst = std::max(worst, std::abs(fast.values()[row * F + f] - e) / denom);
    }
  }
  return worst;
}

/// Keys whose two nearest codes are closer in squared distance than the float rounding of the
/// GEMM form |C|^2 - 2 k.C can separate (about D 2^-24 (|k|^2 + |C|^2); 1e-5 is a 10x margin
/// for D <= 16). Hard VQ assigns such a key by rounding, which may differ between tilings of
/// the keys (a slice of the sequence against the whole); tests of hard VQ that compare two
/// tilings pick inputs with none. k [B, H, N, D], codebook [1, H or 1, c, D].
inline int64_t vq_near_ties(const Tensor& k, const Tensor& codebook) {
  const Shape4 s = k.shape();
  const int64_t codes = codebook.shape()[2];
  int64_t count = 0;
  for (int64_t b = 0; b < s[0]; ++b)
    for (int64_t h = 0; h < s[1]; ++h) {
      const int64_t g = codebook.shape()[1] == 1 ? 0 : h;
      for (int64_t j = 0; j < s[2]; ++j) {
        double d1 = std::numeric_limits<double>::infinity(), d2 = d1, k2 = 0.0, c2 = 0.0;
        for (int64_t x = 0; x < s[3]; ++x) k2 += double(k.at(b, h, j, x)) * k.at(b, h, j, x);
        for (int64_t c = 0; c < codes; ++c) {
          double d = 0.0, n2 = 0.0;
          for (int64_t x = 0; x < s[3]; ++x) {
            const double e = double(k.at(b, h, j, x)) - codebook.at(0, g, c, x);
            d += e * e;
            n2 += double(codebook.at(0, g, c, x)) * codebook.at(0, g, c, x);
          }
          d2 = d < d1 ? d1 : std::min(d2, d);
          d1 = std::min(d1, d);
          c2 = std::max(c2, n2);
        }
        count += d2 - d1 < 1e-5 * (k2 + c2);
      }
    }
  return count;
}

/// Tokens [i, i + count) of a C-contiguous [B, H, N, X] tensor, as a strided view.
inline TensorView tokens(const Tensor& t, int64_t i, int64_t count = 1) {
  return TensorView{t.values().data() + i * t.shape()[3],
                    {t.shape()[0], t.shape()[1], count, t.shape()[3]},
                    contiguous_strides(t.shape())};
}

/// A transposed-layout copy: same logical tensor stored as [B, N, H, D], viewed as
/// [B, H, N, D] through strides (exercises non-contiguous views).
struct StridedCopy {
  std::vector<float> storage;
  TensorView view;
  explicit StridedCopy(const Tensor& t) {
    const auto& s = t.shape();
    storage.resize(static_cast<size_t>(t.numel()));
    const Shape4 strides{s[2] * s[1] * s[3], s[3], s[1] * s[3], 1};
    for (int64_t b = 0; b < s[0]; ++b)
      for (int64_t h = 0; h < s[1]; ++h)
        for (int64_t n = 0; n < s[2]; ++n)
          for (int64_t x = 0; x < s[3]; ++x)
            storage[b * strides[0] + h * strides[1] + n * strides[2] + x] = t.at(b, h, n, x);
    view = TensorView{storage.data(), s, strides};
  }
};

/// Restores the thread count when it goes out of scope (tests that set it).
class ThreadCount {
 public:
  ThreadCount() : saved_(num_threads()) {}
  ~ThreadCount() { set_num_threads(saved_); }

 private:
  int saved_;
};

/// Expects f to throw favor::Error with `fragment` in its message.
inline void expect_error(const std::function<void()>& f, const std::string& fragment) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one mentioning '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    const std::invalid_argument& base = e;  // the contract for bindings
    (void)base;
  }
}

}  // namespace favor::testing
