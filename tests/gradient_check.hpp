#pragma once
// The gradient checks shared by test_backward.cpp and test_map_gradients.cpp: central finite
// differences over float arrays, the scalar loss <dy, y> they differentiate, the inputs of a
// fast backward, and the rule for a fast float32 gradient against the double reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "favor/favor.hpp"
#include "test_helpers.hpp"

namespace favor::testing {

/// The loss L = <dy, y> = sum_i dy_i y_i, whose gradient with respect to the output y is dy.
inline double output_loss(const Tensor& dy, const std::vector<double>& y) {
  double l = 0;
  for (size_t i = 0; i < y.size(); ++i) l += double(dy.values()[i]) * y[i];
  return l;
}

/// Relative Frobenius error of float or double values against the reference.
template <class V>
double gradient_error(const V& approx, const std::vector<double>& exact) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < exact.size(); ++i) {
    diff += (double(approx[i]) - exact[i]) * (double(approx[i]) - exact[i]);
    norm += exact[i] * exact[i];
  }
  return std::sqrt(diff / norm);
}

/// Every how-many-th element of x the finite differences probe: all of them in the tests'
/// own build. The sanitizer builds (scripts/sanitize.sh: the same suite, looking for memory
/// errors and UB, at about a sixth of the speed) define FAVOR_TEST_FD_STRIDE 7
/// (tests/CMakeLists.txt): the backward under test still runs whole and every gradient
/// element is still computed; only the reference's probes are thinned (each probe runs
/// the same code as the others), which took 190 of the ASan run's 295 s.
#ifdef FAVOR_TEST_FD_STRIDE
inline constexpr size_t kFdStride = FAVOR_TEST_FD_STRIDE;
#else
inline constexpr size_t kFdStride = 1;
#endif

/// || fd - analytic || / || analytic || over the float array x (the elements it probes:
/// every kFdStride-th), central differences of loss(): the steps actually taken (x +- 1e-5
/// rounded to float) divide. A stride of 7 is prime to the sizes of the tests' arrays, so
/// the probes still visit every row and column.
inline double fd_error_float(std::vector<float>& x, const std::vector<double>& analytic,
                             const std::function<double()>& loss) {
  std::vector<double> fd, exact;
  for (size_t i = 0; i < x.size(); i += kFdStride) {
    const float saved = x[i];
    const float up_x = static_cast<float>(saved + 1e-5), down_x = static_cast<float>(saved - 1e-5);
    x[i] = up_x;
    const double up = loss();
    x[i] = down_x;
    const double down = loss();
    x[i] = saved;
    fd.push_back((up - down) / (double(up_x) - double(down_x)));
    exact.push_back(analytic[i]);
  }
  return gradient_error(fd, exact);
}

/// The inputs of a fast backward against the reference: q, k of row norms ~U(0.5, 1.5), v and
/// dy N(0, 1) (seeds 1 to 4), and the key mask [B, Nk] (masked: every third key from key 1
/// out; else every key in).
struct BackwardInputs {
  int64_t batch, nk;
  bool masked;
  Tensor q, k, v, dy;
  std::vector<uint8_t> mask;

  BackwardInputs(int64_t B, int64_t H, int64_t Nq, int64_t Nk, int64_t D, int64_t Dv,
                 bool masked_keys)
      : batch(B),
        nk(Nk),
        masked(masked_keys),
        q(random_tensor({B, H, Nq, D}, 1, 1.0)),
        k(random_tensor({B, H, Nk, D}, 2, 1.0)),
        v(random_tensor({B, H, Nk, Dv}, 3)),
        dy(random_tensor({B, H, Nq, Dv}, 4)),
        mask(masked ? periodic_mask(static_cast<size_t>(B * Nk), 3, 1)
                    : std::vector<uint8_t>(static_cast<size_t>(B * Nk), 1)) {}

  /// The key mask for AttentionOptions::key_mask (none unless masked).
  std::optional<KeyMaskView> key_mask() const {
    if (!masked) return std::nullopt;
    return KeyMaskView::contiguous(mask.data(), batch, nk);
  }

  /// favor_attention_backward with the parameter gradients, through strided (transposed
  /// layout) views of the inputs if `strided`.
  template <class Map>
  AttentionGrads fast_backward(const Map& map, const AttentionOptions& o, bool strided) const {
    if (!strided) return favor_attention_backward(q, k, v, dy, map, o, true);
    StridedCopy qs(q), ks(k), vs(v), dys(dy);
    return favor_attention_backward(qs.view, ks.view, vs.view, dys.view, map, o, true);
  }
};

/// What expect_within_twice_naive compared: the relative errors of the fast and the naive
/// float32 gradients, or `zero` where the reference vanishes (nothing relative to compare).
struct GradientComparison {
  bool zero = false;
  double error = 0, naive_error = 0;
};

/// A fast gradient `got` against the double reference `exact` (docs/numerics.md): its
/// relative error is at most twice that of the naive float32 evaluation `naive32`, plus 1e-6.
/// A reference that is zero up to double rounding (one key: y = v_0 whatever q, k and the
/// map, so dq, dk and the map's gradients vanish) has no relative error; the fast result is
/// then a cancellation of O(|v| |dy|) terms, rounding ~F 2^-24 ~ 1e-6: |got| <= 1e-5.
template <class V>
GradientComparison expect_within_twice_naive(const V& got, const std::vector<float>& naive32,
                                             const std::vector<double>& exact,
                                             const std::string& label) {
  double exact_max = 0, got_max = 0;
  for (double e : exact) exact_max = std::max(exact_max, std::abs(e));
  for (auto g : got) got_max = std::max(got_max, double(std::abs(g)));
  if (exact_max < 1e-10) {
    EXPECT_LE(got_max, 1e-5) << label;
    return {true};
  }
  GradientComparison r;
  r.naive_error = gradient_error(naive32, exact);
  r.error = gradient_error(got, exact);
  EXPECT_LE(r.error, 2 * r.naive_error + 1e-6) << label << ", naive " << r.naive_error;
  return r;
}

}  // namespace favor::testing
