// The bf16 forward (AttentionOptions::precision = bf16, src/cpu/favor_bidirectional_bf16.cpp):
// within the derived rounding bound of the float64 reference where it runs, and the fp32
// path bit for bit where it does not (no AVX512-BF16, FAVOR_NO_BF16, causal).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "favor/favor.hpp"
#include "reference/naive.hpp"
#include "test_helpers.hpp"

namespace favor {
namespace {

using testing::random_tensor;
using testing::rel_error;

// Sets FAVOR_NO_BF16 for the scope and restores what was there.
class NoBf16Scope {
 public:
  NoBf16Scope() {
    const char* old = std::getenv("FAVOR_NO_BF16");
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv("FAVOR_NO_BF16", "1", 1);
  }
  ~NoBf16Scope() {
    if (had_) {
      setenv("FAVOR_NO_BF16", old_.c_str(), 1);
    } else {
      unsetenv("FAVOR_NO_BF16");
    }
  }

 private:
  bool had_ = false;
  std::string old_;
};

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.values() == b.values();
}

// Worst relative change of a positive feature of row x (head h) when x and W are rounded to
// bf16 for the projection (fp32 accumulation over d terms) and the feature itself to bf16:
// |a' - a| <= (2u + u^2 + gamma_d) sum_t |W_ft| |x~_t| with x~ = x D^(-1/4), then
// exp(|a' - a|) (1 + u) - 1 (docs/numerics.md, "bf16 forward").
double feature_eta(const Tensor& x, int64_t h, int64_t row, const Projection& w) {
  constexpr double u = 1.0 / 256.0, fp32 = 1.0 / 16777216.0;
  const int64_t d = x.shape()[3];
  const double gamma = d * fp32 / (1.0 - d * fp32);
  const double s = std::pow(double(d), -0.25);
  double worst = 0.0;
  for (int64_t f = 0; f < w.m(); ++f) {
    double sum = 0.0;
    for (int64_t t = 0; t < d; ++t)
      sum += std::abs(double(w.at(f, t))) * std::abs(double(x.view().at(0, h, row, t))) * s;
    worst = std::max(worst, sum);
  }
  return std::exp((2.0 * u + u * u + gamma) * worst) * (1.0 + u) - 1.0;
}

// Frobenius norm of the elementwise bound |y_bf16 - y| <= (rho_N Vmax_c + rho_D |y_ic|) /
// (1 - rho_D), rho_N = (1 + eta_q)(1 + eta_k)(1 + u)^2 - 1 (features, v and S rounded),
// rho_D = (1 + eta_q)(1 + eta_k)(1 + u) - 1 (the ones column is exact).
double bf16_bound(const Tensor& q, const Tensor& k, const Tensor& v, const Projection& w,
                  const reference::DTensor& ref) {
  constexpr double u = 1.0 / 256.0;
  const int64_t H = q.shape()[1], nq = q.shape()[2], nk = k.shape()[2], dv = v.shape()[3];
  double total = 0.0;
  for (int64_t h = 0; h < H; ++h) {
    double eta_k = 0.0;
    for (int64_t j = 0; j < nk; ++j) eta_k = std::max(eta_k, feature_eta(k, h, j, w));
    std::vector<double> vmax(static_cast<size_t>(dv), 0.0);
    for (int64_t j = 0; j < nk; ++j)
      for (int64_t c = 0; c < dv; ++c)
        vmax[c] = std::max(vmax[c], std::abs(double(v.view().at(0, h, j, c))));
    for (int64_t i = 0; i < nq; ++i) {
      const double eta_q = feature_eta(q, h, i, w);
      const double rho_d = (1.0 + eta_q) * (1.0 + eta_k) * (1.0 + u) - 1.0;
      const double rho_n = (1.0 + rho_d) * (1.0 + u) - 1.0;
      for (int64_t c = 0; c < dv; ++c) {
        const double b = (rho_n * vmax[c] + rho_d * std::abs(ref.at(0, h, i, c))) / (1.0 - rho_d);
        total += b * b;
      }
    }
  }
  return std::sqrt(total);
}

double frobenius(const std::vector<double>& x) {
  double s = 0.0;
  for (double e : x) s += e * e;
  return std::sqrt(s);
}

struct Bf16Case {
  Kernel kernel;
  bool masked;
};

class Bf16Forward : public ::testing::TestWithParam<Bf16Case> {};

// N = 300 keys and queries: one full 256-row tile and a tail; D = Dv = 64, m = 256.
TEST_P(Bf16Forward, WithinDerivedBoundOfReferenceOrFp32Fallback) {
  const Bf16Case c = GetParam();
  const int64_t H = 2, N = 300, D = 64, m = 256;
  const double norm = std::pow(double(D), 0.25);
  const Tensor q = random_tensor({1, H, N, D}, 11, norm);
  const Tensor k = random_tensor({1, H, N, D}, 12, norm);
  const Tensor v = random_tensor({1, H, N, D}, 13);
  const Projection w = Projection::draw(m, D, {ProjectionKind::orthogonal, NormMode::chi, 5});
  std::vector<uint8_t> mask = testing::periodic_mask(N, 4, 2);
  AttentionOptions o;
  o.kernel = c.kernel;
  if (c.masked) o.key_mask = KeyMaskView::contiguous(mask.data(), 1, N);
  const Tensor f32 = favor_attention(q, k, v, w, o);
  o.precision = Precision::bf16;
  AttentionStats stats;
  const Tensor bf16 = favor_attention(q, k, v, w, o, &stats);
  if (!bf16_available()) {
    EXPECT_EQ(stats.precision, Precision::f32);
    EXPECT_TRUE(same_bits(bf16, f32));
    GTEST_SKIP() << "no bf16 here: checked the fp32 fallback only";
  }
  EXPECT_EQ(stats.precision, Precision::bf16);
  EXPECT_EQ(stats.zero_rows, 0);
  o.precision = Precision::f32;
  const auto ref = reference::favor_attention(q, k, v, w, o);
  o.scale = 1.0 / std::sqrt(double(D));
  const auto naive32 = reference::naive::favor_attention<float>(q, k, v, w, o);
  // The bf16 rounding bound, plus the fp32 arithmetic allowance of FavorVsReference.
  const double ref_norm = frobenius(ref.values);
  const double bound =
      bf16_bound(q, k, v, w, ref) / ref_norm + 2.0 * rel_error(naive32, ref.values) + 1e-6;
  const double err = rel_error(bf16, ref.values);
  EXPECT_LE(err, bound);
  EXPECT_GT(rel_error(bf16, ref.values), rel_error(f32, ref.values));  // bf16 did round
}

INSTANTIATE_TEST_SUITE_P(Kernels, Bf16Forward,
                         ::testing::Values(Bf16Case{Kernel::positive, false},
                                           Bf16Case{Kernel::positive, true},
                                           Bf16Case{Kernel::hyperbolic, false}));

TEST(Bf16Fallback, ForcedOffAndCausalRunFp32BitForBit) {
  const Tensor q = random_tensor({1, 2, 70, 16}, 21, 2.0);
  const Tensor k = random_tensor({1, 2, 70, 16}, 22, 2.0);
  const Tensor v = random_tensor({1, 2, 70, 8}, 23);
  const Projection w = Projection::draw(32, 16, {ProjectionKind::orthogonal, NormMode::chi, 3});
  for (bool causal : {false, true}) {
    AttentionOptions o;
    o.causal = causal;
    const Tensor f32 = favor_attention(q, k, v, w, o);
    o.precision = Precision::bf16;
    AttentionStats stats;
    if (causal) {  // not implemented in bf16: the fp32 path
      const Tensor out = favor_attention(q, k, v, w, o, &stats);
      EXPECT_EQ(stats.precision, Precision::f32);
      EXPECT_TRUE(same_bits(out, f32));
      continue;
    }
    NoBf16Scope off;
    EXPECT_FALSE(bf16_available());
    const Tensor out = favor_attention(q, k, v, w, o, &stats);
    EXPECT_EQ(stats.precision, Precision::f32);
    EXPECT_TRUE(same_bits(out, f32));
  }
}

TEST(Bf16Fallback, BuildInfoSaysWhetherBf16Runs) {
  const std::string info = build_info();
  EXPECT_NE(info.find(bf16_available() ? "bf16 avx512-bf16" : "bf16 off"), std::string::npos)
      << info;
  NoBf16Scope off;
  EXPECT_NE(build_info().find("bf16 off (FAVOR_NO_BF16)"), std::string::npos);
}

}  // namespace
}  // namespace favor
