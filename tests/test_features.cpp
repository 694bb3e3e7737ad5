// Statistics of the feature maps: unbiasedness (mean over many seeds within a bound built
// from the variance), agreement of the empirical MSE with the closed form of math.md s.4,
// and the error shrinking like 1/sqrt(m). All with fixed seeds; rerun with
//   ./favor_tests --gtest_filter='Features*'
#include <gtest/gtest.h>

#include <cmath>

#include "test_helpers.hpp"

namespace favor {
namespace {

// Two unit-scale vectors (scale = 1: the kernel is exp(x.y)) with |x + y|^2 <= 2.
struct Pair {
  Tensor x, y;
  double sm, z2, diff2, x2, y2;
};

Pair make_pair(int64_t d) {
  Pair p{Tensor({1, 1, 1, d}), Tensor({1, 1, 1, d}), 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < d; ++i) {
    p.x.at(0, 0, 0, i) = static_cast<float>(0.35 * std::cos(1.0 + i));
    p.y.at(0, 0, 0, i) = static_cast<float>(0.3 * std::sin(2.0 + 0.5 * i));
  }
  double dot = 0;
  for (int64_t i = 0; i < d; ++i) {
    const double a = p.x.at(0, 0, 0, i), b = p.y.at(0, 0, 0, i);
    dot += a * b;
    p.z2 += (a + b) * (a + b);
    p.diff2 += (a - b) * (a - b);
    p.x2 += a * a;
    p.y2 += b * b;
  }
  p.sm = std::exp(dot);
  return p;
}

// Closed-form MSE with iid projections (math.md s.4).
double closed_form_mse(Kernel kernel, const Pair& p, int64_t m) {
  const double pos = std::exp(p.z2) * p.sm * p.sm * (1.0 - std::exp(-p.z2)) / double(m);
  switch (kernel) {
    case Kernel::positive:
      return pos;
    case Kernel::trig:
      return std::exp(p.z2) / (2.0 * m) / (p.sm * p.sm) * std::pow(1.0 - std::exp(-p.diff2), 2);
    case Kernel::hyperbolic:
      return 0.5 * (1.0 - std::exp(-p.z2)) * pos;
  }
  return 0;
}

struct Sample {
  double mean = 0, var = 0, mse = 0, m4 = 0;  // m4: fourth central moment of the estimate
};

Sample estimate(Kernel kernel, ProjectionKind kind, const Pair& p, int64_t m, int seeds) {
  std::vector<double> est;
  FeatureOptions o{kernel, 1.0};
  for (int s = 0; s < seeds; ++s) {
    const Projection w =
        Projection::draw(m, p.x.shape()[3], {kind, NormMode::chi, uint64_t(1000 + s)});
    const Tensor fx = features(p.x, w, o), fy = features(p.y, w, o);
    double e = 0;
    for (int64_t f = 0; f < fx.shape()[3]; ++f) e += double(fx.values()[f]) * fy.values()[f];
    est.push_back(e);
  }
  Sample r;
  for (double e : est) r.mean += e / seeds;
  for (double e : est) {
    r.var += (e - r.mean) * (e - r.mean) / (seeds - 1);
    r.mse += (e - p.sm) * (e - p.sm) / seeds;
    r.m4 += std::pow(e - r.mean, 4) / seeds;
  }
  return r;
}

class FeaturesUnbiased : public ::testing::TestWithParam<std::tuple<Kernel, ProjectionKind>> {};

TEST_P(FeaturesUnbiased, MeanWithinFiveStandardErrors) {
  const auto [kernel, kind] = GetParam();
  const Pair p = make_pair(6);
  ASSERT_LE(p.z2, 2.0);
  const int seeds = 3000;
  const Sample s = estimate(kernel, kind, p, 8, seeds);
  // Standard error of the mean from the sample variance; 5 sigma: a false failure has
  // probability < 1e-6 (and the seeds are fixed, so the result is deterministic).
  EXPECT_NEAR(s.mean, p.sm, 5.0 * std::sqrt(s.var / seeds))
      << to_string(kernel) << " " << to_string(kind);
}

INSTANTIATE_TEST_SUITE_P(
    All, FeaturesUnbiased,
    ::testing::Combine(::testing::Values(Kernel::positive, Kernel::trig, Kernel::hyperbolic),
                       ::testing::Values(ProjectionKind::iid, ProjectionKind::orthogonal)),
    [](const auto& info) {
      return to_string(std::get<0>(info.param)) + "_" + to_string(std::get<1>(info.param));
    });

class FeaturesMse : public ::testing::TestWithParam<Kernel> {};

TEST_P(FeaturesMse, IidMseMatchesClosedFormAndFallsLikeOneOverM) {
  // For iid projections the MSE is exactly closed_form(m) = c/m; the empirical MSE over S
  // seeds has standard error sqrt((mu4 - var^2)/S). Checking m = 4, 16, 64 against c/m
  // shows the error shrinking like 1/sqrt(m).
  const Kernel kernel = GetParam();
  const Pair p = make_pair(6);
  const int seeds = 3000;
  for (int64_t m : {4, 16, 64}) {
    const Sample s = estimate(kernel, ProjectionKind::iid, p, m, seeds);
    const double expected = closed_form_mse(kernel, p, m);
    const double se = std::sqrt(std::max(s.m4 - s.var * s.var, 0.0) / seeds);
    EXPECT_NEAR(s.mse, expected, 5.0 * se + 1e-12) << to_string(kernel) << " m=" << m;
  }
}

INSTANTIATE_TEST_SUITE_P(All, FeaturesMse,
                         ::testing::Values(Kernel::positive, Kernel::trig, Kernel::hyperbolic),
                         [](const auto& info) { return to_string(info.param); });

TEST(Features, OrthogonalPositiveBeatsIid) {
  // Theorem 2 (math.md s.4): for m <= d, MSE_ort <= MSE_iid - 2(m-1)/(m(d+2)) (SM -
  // e^{-(|x|^2+|y|^2)/2})^2.
  const Pair p = make_pair(6);
  const int seeds = 4000;
  const Sample iid = estimate(Kernel::positive, ProjectionKind::iid, p, 6, seeds);
  const Sample ort = estimate(Kernel::positive, ProjectionKind::orthogonal, p, 6, seeds);
  const double gap = 2.0 * 5 / (6.0 * 8) * std::pow(p.sm - std::exp(-(p.x2 + p.y2) / 2), 2);
  const double bound = closed_form_mse(Kernel::positive, p, 6) - gap;
  const double se = std::sqrt(std::max(ort.m4 - ort.var * ort.var, 0.0) / seeds);
  EXPECT_LE(ort.mse, bound + 5 * se);
  EXPECT_LT(ort.mse, iid.mse);
}

TEST(Features, ExactMapMatchesReference) {
  // The fast features() equals the double reference map: positive and hyperbolic
  // features element by element, relative (the exponent carries ~D ulps of rounding:
  // below 64 * 2^-24 ~ 4e-6); trig features relative to the row's amplitude
  // exp(|x|^2/2)/sqrt(m), since sin and cos cross zero.
  const Tensor x = testing::random_tensor({2, 3, 130, 9}, 5, 1.5);
  for (Kernel kernel : {Kernel::positive, Kernel::trig, Kernel::hyperbolic}) {
    const Projection w = Projection::draw(21, 9, {ProjectionKind::orthogonal, NormMode::chi, 2});
    const Tensor fast = features(x, w, {kernel, std::nullopt});
    const auto ref = reference::features(x, w, {kernel, std::nullopt});
    ASSERT_EQ(fast.shape(), ref.shape);
    EXPECT_LE(testing::worst_feature_error(fast, ref, kernel == Kernel::trig), 4e-6)
        << to_string(kernel);
  }
}

TEST(Features, KernelMseMetricMatchesClosedForm) {
  // kernel_mse over one pair averaged over seeds approaches the closed-form MSE.
  const Pair p = make_pair(6);
  double mean = 0;
  const int seeds = 2000;
  for (int s = 0; s < seeds; ++s) {
    mean += kernel_mse(p.x, p.y,
                       Projection::draw(16, 6, {ProjectionKind::iid, NormMode::chi, uint64_t(s)}),
                       {Kernel::positive, 1.0}) /
            seeds;
  }
  const Sample s = estimate(Kernel::positive, ProjectionKind::iid, p, 16, seeds);
  EXPECT_NEAR(mean, closed_form_mse(Kernel::positive, p, 16),
              5.0 * std::sqrt((s.m4 - s.var * s.var) / seeds));
}

// The library's closed forms (favor::iid_mse, written from the variance of one term) against
// the math.md s.4 forms above, derived independently: the same numbers to rounding.
TEST(Features, LibraryClosedFormsEqualMathMd) {
  const Pair p = make_pair(6);
  std::vector<double> x(6), y(6);
  for (int64_t i = 0; i < 6; ++i) {
    x[i] = p.x.at(0, 0, 0, i);
    y[i] = p.y.at(0, 0, 0, i);
  }
  for (Kernel k : {Kernel::positive, Kernel::trig, Kernel::hyperbolic}) {
    const double expected = closed_form_mse(k, p, 16);
    EXPECT_NEAR(iid_mse(k, x.data(), y.data(), 6, 16), expected, 1e-12 * expected) << to_string(k);
  }
  // FAVOR++ with A = 0 is FAVOR+.
  const KernelFit zero = KernelFit::constant(0.0, 6);
  EXPECT_NEAR(iid_mse(Kernel::favorpp, x.data(), y.data(), 6, 16, &zero),
              closed_form_mse(Kernel::positive, p, 16),
              1e-12 * closed_form_mse(Kernel::positive, p, 16));
}

}  // namespace
}  // namespace favor
