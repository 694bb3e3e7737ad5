// FAVOR++ and FAVOR# (math.md s.2, s.4): the optimal A and the fit, the closed-form
// variances, unbiasedness of every kernel with every projection, and the fast kernels
// (bidirectional, causal, streaming, backward) against the double reference.
//
// Statistical tests use fixed seeds and bounds derived from the variance: a sample mean
// of S independent estimates is within 5 standard errors (s / sqrt(S), s the sample
// standard deviation) of its expectation, except with probability ~6e-7; a sample
// variance is within 5 sqrt((mu4 - s^4) / S) of the true variance (mu4 the sample fourth
// central moment; the standard error of a sample variance).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "reference/naive.hpp"
#include "test_helpers.hpp"

namespace favor {
namespace {
using testing::random_tensor;
using testing::rel_error;

// A single row [1, 1, 1, d] from values.
Tensor row(const std::vector<double>& x) {
  Tensor t({1, 1, 1, static_cast<int64_t>(x.size())});
  for (size_t i = 0; i < x.size(); ++i) t.data()[i] = static_cast<float>(x[i]);
  return t;
}

// Rows x, y in d dims with |x| = rx, |y| = ry and cosine c (exactly representable in float
// up to rounding; the tests use the float values they pass).
std::pair<std::vector<double>, std::vector<double>> pair_with(int64_t d, double rx, double ry,
                                                              double c) {
  std::vector<double> x(static_cast<size_t>(d), 0.0), y(static_cast<size_t>(d), 0.0);
  x[0] = rx;
  y[0] = ry * c;
  y[1 % d] += ry * std::sqrt(std::max(0.0, 1.0 - c * c));
  for (auto& v : x) v = static_cast<float>(v);
  for (auto& v : y) v = static_cast<float>(v);
  return {x, y};
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// log(second moment of FAVOR++ at A / second moment of FAVOR+), one pair, d dims.
double log_second_moment_ratio(double a, int64_t d, double zz) {
  return d * std::log1p(-4.0 * a) - 0.5 * d * std::log1p(-8.0 * a) +
         2.0 * (1.0 - 4.0 * a) / (1.0 - 8.0 * a) * zz - 2.0 * zz;
}

TEST(EstimatorFormula, OptimalAIsZeroAtRhoZeroAndMinimisesTheVariance) {
  EXPECT_EQ(optimal_a(0.0), 0.0);
  for (double rho : {0.01, 0.1, 1.0, 5.0}) {
    const int64_t d = 16;
    const double a = optimal_a(rho), zz = rho * d;
    EXPECT_LT(a, 0.0);
    // The second moment (hence the variance) is minimal at A*: larger a step either way.
    for (double step : {-1e-3, 1e-3}) {
      EXPECT_LT(log_second_moment_ratio(a, d, zz), log_second_moment_ratio(a + step, d, zz))
          << "rho " << rho;
    }
  }
  EXPECT_THROW(optimal_a(-1.0), Error);
}

// The figures: log Var(FAVOR++) / Var(FAVOR+) = -2.03 at d = 64, |x+y|^2 = 10 and
// -61.2 at |x+y|^2 = 100, here with A from fit_kernel on the pair itself (rho = |z|^2/d).
TEST(EstimatorFormula, VarianceLogRatioFromFittedA) {
  const int64_t d = 64;
  // Tolerance: half a unit in the last digit quoted.
  for (auto [zz, expected, tol] :
       {std::tuple{10.0, -2.03, 0.005}, std::tuple{100.0, -61.2, 0.05}}) {
    const auto [x, y] = pair_with(d, std::sqrt(zz) / 2, std::sqrt(zz) / 2, 1.0);
    const double zz_f = dot(x, x) + dot(y, y) + 2 * dot(x, y);
    const KernelFit fit = fit_kernel(Kernel::favorpp, row(x), row(y), 1.0);
    ASSERT_EQ(fit.heads, 1);
    EXPECT_NEAR(fit.a[0], optimal_a(zz_f / d), 1e-12);
    const double var_pp = iid_mse(Kernel::favorpp, x.data(), y.data(), d, 1, &fit);
    const double var_p = iid_mse(Kernel::positive, x.data(), y.data(), d, 1);
    EXPECT_NEAR(std::log(var_pp / var_p), expected, tol) << "|z|^2 = " << zz;
    EXPECT_NEAR(log_second_moment_ratio(fit.a[0], d, zz_f), expected, tol);
  }
}

TEST(FitKernel, FavorppRhoFromMomentsWithMaskedKeysLeftOut) {
  const int64_t B = 2, H = 2, N = 40, D = 6;
  const Tensor q = random_tensor({B, H, N, D}, 5, 1.5);
  Tensor k = random_tensor({B, H, N, D}, 6, 1.5);
  const auto mask = testing::periodic_mask(static_cast<size_t>(B * N), 4, 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 0; j < N; j += 4) k.at(b, h, j, 0) = 1e3f;  // masked: must not count
  const double scale = 0.3;
  const KernelFit fit =
      fit_kernel(Kernel::favorpp, q, k, scale, KeyMaskView::contiguous(mask.data(), B, N));
  ASSERT_EQ(fit.heads, B * H);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> mq(D, 0.0), mk(D, 0.0);
      double sq = 0.0, sk = 0.0, nk = 0.0;
      for (int64_t i = 0; i < N; ++i)
        for (int64_t t = 0; t < D; ++t) {
          const double x = std::sqrt(scale) * q.at(b, h, i, t);
          mq[t] += x / N;
          sq += x * x / N;
        }
      for (int64_t j = 0; j < N; ++j) {
        if (!mask[b * N + j]) continue;
        nk += 1;
        for (int64_t t = 0; t < D; ++t) {
          const double y = std::sqrt(scale) * k.at(b, h, j, t);
          mk[t] += y;
          sk += y * y;
        }
      }
      for (auto& v : mk) v /= nk;
      const double rho = (sq + sk / nk + 2 * dot(mq, mk)) / D;
      for (int64_t l = 0; l < D; ++l) {
        EXPECT_NEAR(fit.a[(b * H + h) * D + l], optimal_a(rho), 1e-12);
      }
    }
}

TEST(FitKernel, FavorsharpBasisDiagonalisesTheMomentMatrix) {
  const int64_t N = 300, D = 5;
  const Tensor q = random_tensor({1, 1, N, D}, 8, 2.0);
  const Tensor k = random_tensor({1, 1, N, D}, 9, 2.0);
  const KernelFit fit = fit_kernel(Kernel::favorsharp, q, k, 1.0);
  // P = M1 + M2 + mu1 mu2^T + mu2 mu1^T from the rows directly.
  std::vector<double> p(D * D, 0.0), m1(D, 0.0), m2(D, 0.0);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t r = 0; r < D; ++r) {
      m1[r] += q.at(0, 0, i, r) / double(N);
      m2[r] += k.at(0, 0, i, r) / double(N);
      for (int64_t c = 0; c < D; ++c) {
        p[r * D + c] += (double(q.at(0, 0, i, r)) * q.at(0, 0, i, c) +
                         double(k.at(0, 0, i, r)) * k.at(0, 0, i, c)) /
                        N;
      }
    }
  for (int64_t r = 0; r < D; ++r)
    for (int64_t c = 0; c < D; ++c) p[r * D + c] += m1[r] * m2[c] + m2[r] * m1[c];
  for (int64_t l = 0; l < D; ++l) {
    std::vector<double> u(D), pu(D, 0.0);
    for (int64_t r = 0; r < D; ++r) u[r] = fit.basis[r * D + l];
    for (int64_t r = 0; r < D; ++r)
      for (int64_t c = 0; c < D; ++c) pu[r] += p[r * D + c] * u[c];
    const double s = dot(u, pu);  // Rayleigh quotient = eigenvalue
    for (int64_t r = 0; r < D; ++r) EXPECT_NEAR(pu[r], s * u[r], 1e-9 * (1 + s));
    EXPECT_NEAR(fit.a[l], optimal_a(s), 1e-12);
    EXPECT_NEAR(dot(u, u), 1.0, 1e-12);
  }
}

// ---- Unbiasedness of every kernel with every unbiased projection kind -----------------

struct Estimate {
  Kernel kernel;
  ProjectionKind projection;
};

std::string estimate_name(const ::testing::TestParamInfo<Estimate>& info) {
  return to_string(info.param.kernel) + "_" + to_string(info.param.projection);
}

// phi(x).phi(y) with `features` (the exact map, constants kept).
double kernel_estimate(const Tensor& x, const Tensor& y, const Projection& w,
                       const FeatureOptions& o) {
  const Tensor px = features(x, w, o), py = features(y, w, o);
  double s = 0.0;
  for (int64_t f = 0; f < px.numel(); ++f) s += double(px.data()[f]) * py.data()[f];
  return s;
}

// A fit from a few calibration rows (any fit is unbiased; this one is not degenerate).
FeatureOptions options_for(Kernel kernel, int64_t d) {
  FeatureOptions o{kernel, 1.0, std::nullopt};
  if (data_adapted(kernel)) {
    o.fit = fit_kernel(kernel, random_tensor({1, 1, 20, d}, 41, 0.6),
                       random_tensor({1, 1, 20, d}, 42, 0.6), 1.0);
  }
  return o;
}

class Unbiased : public ::testing::TestWithParam<Estimate> {};

TEST_P(Unbiased, MeanOverSeedsWithinFiveStandardErrors) {
  const auto [kernel, kind] = GetParam();
  const int64_t d = 8, m = 16, seeds = 1500;
  const FeatureOptions o = options_for(kernel, d);
  for (double c : {0.9, -0.5}) {
    const auto [xv, yv] = pair_with(d, 0.6, 0.7, c);
    const Tensor x = row(xv), y = row(yv);
    double sum = 0.0, sum2 = 0.0;
    for (int64_t s = 0; s < seeds; ++s) {
      const Projection w = Projection::draw(m, d, {kind, NormMode::chi, uint64_t(1000 + s)});
      const double e = kernel_estimate(x, y, w, o);
      sum += e;
      sum2 += e * e;
    }
    const double mean = sum / seeds, sd = std::sqrt(std::max(0.0, sum2 / seeds - mean * mean));
    const double sm = std::exp(dot(xv, yv));
    EXPECT_NEAR(mean, sm, 5.0 * sd / std::sqrt(double(seeds)))
        << "cos " << c << " relative bias " << mean / sm - 1 << " sd " << sd;
  }
}

std::vector<Estimate> unbiased_cases() {
  std::vector<Estimate> out;
  for (Kernel k :
       {Kernel::positive, Kernel::trig, Kernel::hyperbolic, Kernel::favorpp, Kernel::favorsharp})
    for (ProjectionKind p : {ProjectionKind::iid, ProjectionKind::orthogonal,
                             ProjectionKind::radial, ProjectionKind::qmc, ProjectionKind::simplex})
      out.push_back({k, p});
  return out;
}
INSTANTIATE_TEST_SUITE_P(AllKinds, Unbiased, ::testing::ValuesIn(unbiased_cases()), estimate_name);

// ---- Empirical variance against the closed form (iid projections) --------------------

class ClosedForm : public ::testing::TestWithParam<Kernel> {};

TEST_P(ClosedForm, EmpiricalVarianceMatchesIidFormula) {
  const Kernel kernel = GetParam();
  const int64_t d = 6, m = 4, seeds = 6000;
  const FeatureOptions o = options_for(kernel, d);
  for (auto [rx, c] : {std::pair{0.5, 0.8}, std::pair{0.7, -0.3}}) {
    const auto [xv, yv] = pair_with(d, rx, 0.6, c);
    const Tensor x = row(xv), y = row(yv);
    std::vector<double> e(static_cast<size_t>(seeds));
    double mean = 0.0;
    for (int64_t s = 0; s < seeds; ++s) {
      const Projection w =
          Projection::draw(m, d, {ProjectionKind::iid, NormMode::chi, uint64_t(s)});
      e[s] = kernel_estimate(x, y, w, o);
      mean += e[s] / seeds;
    }
    double var = 0.0, mu4 = 0.0;
    for (double v : e) {
      var += (v - mean) * (v - mean) / seeds;
      mu4 += std::pow(v - mean, 4) / seeds;
    }
    const double expected = iid_mse(kernel, xv.data(), yv.data(), d, m,
                                    o.fit ? &*o.fit : nullptr);  // unbiased: MSE = variance
    EXPECT_NEAR(var, expected, 5.0 * std::sqrt((mu4 - var * var) / seeds))
        << "|x| " << rx << " cos " << c << " ratio " << var / expected;
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, ClosedForm,
                         ::testing::Values(Kernel::positive, Kernel::trig, Kernel::hyperbolic,
                                           Kernel::favorpp, Kernel::favorsharp),
                         [](const auto& info) { return to_string(info.param); });

// FAVOR++ and FAVOR# never have a larger closed-form variance than FAVOR+ for the pairs
// they were fitted to (A* minimises it; A = 0 is FAVOR+).
TEST(ClosedFormOrdering, FittedKernelsBeatPositiveOnTheirOwnPair) {
  const int64_t d = 16;
  for (double zz : {0.5, 4.0, 20.0}) {
    const auto [x, y] = pair_with(d, std::sqrt(zz) / 2, std::sqrt(zz) / 2, 1.0);
    for (Kernel k : {Kernel::favorpp, Kernel::favorsharp}) {
      const KernelFit fit = fit_kernel(k, row(x), row(y), 1.0);
      EXPECT_LE(iid_mse(k, x.data(), y.data(), d, 1, &fit),
                iid_mse(Kernel::positive, x.data(), y.data(), d, 1))
          << to_string(k) << " |z|^2 " << zz;
    }
  }
}

// At equal features, hyperbolic (m projections, 2m features) never has a larger closed-form
// MSE than positive with 2m projections: their ratio is (1 - exp(-|z|^2)) <= 1.
TEST(ClosedFormOrdering, HyperbolicBeatsPositiveAtEqualFeatures) {
  const int64_t d = 8, m = 32;
  for (double c : {-0.8, 0.0, 0.9}) {
    const auto [x, y] = pair_with(d, 1.0, 1.2, c);
    EXPECT_LE(iid_mse(Kernel::hyperbolic, x.data(), y.data(), d, m),
              iid_mse(Kernel::positive, x.data(), y.data(), d, 2 * m))
        << "cos " << c;
  }
}

// The attention output: FAVOR++ fitted to the data beats FAVOR+ with the same projections,
// and orthogonal beats iid, on the mean error over 8 seeds (fixed; the study in
// docs/accuracy.md shows where these orderings hold and where noise decides them).
TEST(AttentionOrdering, FavorppBeatsPositiveAndOrthogonalBeatsIid) {
  const int64_t N = 256, D = 16, m = 16;
  // Rows of norm 1-3 (scaled: |x| 0.5-1.5): the regime where the errors are well below 1.
  const Tensor q = random_tensor({1, 2, N, D}, 71, 2.0), k = random_tensor({1, 2, N, D}, 72, 2.0);
  const Tensor v = random_tensor({1, 2, N, D}, 73);
  const Tensor exact = exact_attention(q, k, v);
  auto mean_error = [&](Kernel kernel, ProjectionKind kind) {
    double sum = 0.0;
    for (uint64_t seed = 0; seed < 8; ++seed) {
      AttentionOptions o;
      o.kernel = kernel;
      const Projection w = Projection::draw(m, D, {kind, NormMode::chi, seed});
      sum += relative_frobenius_error(favor_attention(q, k, v, w, o), exact) / 8;
    }
    return sum;
  };
  const double pos_orth = mean_error(Kernel::positive, ProjectionKind::orthogonal);
  const double pp_orth = mean_error(Kernel::favorpp, ProjectionKind::orthogonal);
  const double pos_iid = mean_error(Kernel::positive, ProjectionKind::iid);
  EXPECT_LT(pp_orth, pos_orth);
  EXPECT_LT(pos_orth, pos_iid);
  std::printf("favorpp/orthogonal %.4f, positive/orthogonal %.4f, positive/iid %.4f\n", pp_orth,
              pos_orth, pos_iid);
}

// ---- Fast kernels against the double reference ---------------------------------------

struct FastCase {
  Kernel kernel;
  bool causal, masked, strided, per_head_fit;
  int64_t B, H, N, D, Dv, m;
};

class AdaptedVsReference : public ::testing::TestWithParam<FastCase> {};

TEST_P(AdaptedVsReference, WithinTwiceNaiveFloatError) {
  const FastCase c = GetParam();
  const Tensor q = random_tensor({c.B, c.H, c.N, c.D}, 11, 1.2);
  const Tensor k = random_tensor({c.B, c.H, c.N, c.D}, 12, 1.2);
  const Tensor v = random_tensor({c.B, c.H, c.N, c.Dv}, 13);
  const Projection w = Projection::draw(c.m, c.D, {ProjectionKind::orthogonal, NormMode::chi, 3});
  AttentionOptions o;
  o.kernel = c.kernel;
  o.causal = c.causal;
  std::vector<uint8_t> mask = testing::periodic_mask(static_cast<size_t>(c.B * c.N), 3, 1);
  if (c.masked) o.key_mask = KeyMaskView::contiguous(mask.data(), c.B, c.N);
  if (c.causal || c.per_head_fit) {  // a fit from calibration data (other rows)
    const Tensor cq = random_tensor({c.B, c.H, 64, c.D}, 21, 1.2);
    const Tensor ck = random_tensor({c.B, c.H, 64, c.D}, 22, 1.2);
    o.fit = fit_kernel(c.kernel, cq, ck, std::nullopt);
    if (!c.per_head_fit) o.fit = KernelFit::constant(o.fit->a[0], c.D);
  }
  testing::StridedCopy qs(q), ks(k), vs(v);
  AttentionStats stats;
  const Tensor fast =
      favor_attention(c.strided ? qs.view : q.view(), c.strided ? ks.view : k.view(),
                      c.strided ? vs.view : v.view(), w, o, &stats);
  const auto ref = reference::favor_attention(q, k, v, w, o);
  o.scale = 1.0 / std::sqrt(double(c.D));
  const auto naive32 = reference::naive::favor_attention<float>(q, k, v, w, o);
  const double err = rel_error(fast, ref.values), naive_err = rel_error(naive32, ref.values);
  EXPECT_LE(err, 2.0 * naive_err + 1e-6) << "naive float error " << naive_err;
  EXPECT_EQ(stats.zero_rows, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, AdaptedVsReference,
    ::testing::Values(FastCase{Kernel::favorpp, false, false, false, false, 2, 2, 70, 8, 5, 24},
                      FastCase{Kernel::favorpp, false, true, true, true, 2, 2, 257, 8, 5, 24},
                      FastCase{Kernel::favorpp, true, false, false, false, 1, 2, 100, 8, 5, 24},
                      FastCase{Kernel::favorpp, true, true, false, true, 2, 2, 65, 8, 5, 24},
                      FastCase{Kernel::favorsharp, false, false, false, false, 2, 2, 70, 8, 5, 24},
                      FastCase{Kernel::favorsharp, false, true, true, true, 1, 3, 300, 7, 4, 20},
                      FastCase{Kernel::favorsharp, true, false, true, true, 1, 2, 129, 8, 5, 24},
                      FastCase{Kernel::favorsharp, true, true, false, true, 2, 1, 33, 8, 3, 9},
                      // One head: split across threads (key parts / chained causal segments).
                      FastCase{Kernel::favorpp, false, false, false, false, 1, 1, 600, 8, 4, 16},
                      FastCase{Kernel::favorsharp, true, false, false, true, 1, 1, 600, 8, 4, 16}));

// Token t of every head as a [B, H, 1, X] view.
TensorView token(const Tensor& t, int64_t i) {
  const TensorView all = t.view();
  return TensorView{
      all.data + i * all.strides[2], {all.shape[0], all.shape[1], 1, all.shape[3]}, all.strides};
}

TEST(AdaptedDecoder, TokenByTokenEqualsCausalBatch) {
  const int64_t B = 1, H = 2, N = 40, D = 8, Dv = 4, m = 16;
  const Tensor q = random_tensor({B, H, N, D}, 31, 1.0);
  const Tensor k = random_tensor({B, H, N, D}, 32, 1.0);
  const Tensor v = random_tensor({B, H, N, Dv}, 33);
  const Projection w = Projection::draw(m, D, {ProjectionKind::orthogonal, NormMode::chi, 5});
  for (Kernel kernel : {Kernel::favorpp, Kernel::favorsharp}) {
    const KernelFit fit = fit_kernel(kernel, random_tensor({B, H, 30, D}, 34, 1.0),
                                     random_tensor({B, H, 30, D}, 35, 1.0));
    AttentionOptions o;
    o.kernel = kernel;
    o.causal = true;
    o.fit = fit;
    const Tensor batch = favor_attention(q, k, v, w, o);
    Decoder dec(B, H, Dv, w, {kernel, std::nullopt, fit});
    Tensor streamed({B, H, N, Dv});
    for (int64_t t = 0; t < N; ++t) {
      dec.append(token(k, t), token(v, t));
      const Tensor y = dec.query(token(q, t));
      for (int64_t h = 0; h < H; ++h)
        for (int64_t x = 0; x < Dv; ++x) streamed.at(0, h, t, x) = y.at(0, h, 0, x);
    }
    // As for the fixed kernels (test_streaming.cpp): two float32 evaluations of one formula.
    EXPECT_LE(relative_frobenius_error(streamed, batch), 1e-5) << to_string(kernel);
  }
}

// ---- Errors -------------------------------------------------------------------------

TEST(AdaptedErrors, RefusedWithAClearMessage) {
  const Tensor q = random_tensor({1, 2, 10, 4}, 61, 1.0);
  const Tensor v = random_tensor({1, 2, 10, 3}, 62);
  const Projection w = Projection::draw(8, 4);
  auto message = [](auto&& call) {
    try {
      call();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  AttentionOptions o;
  o.kernel = Kernel::favorpp;
  o.causal = true;
  EXPECT_NE(message([&] { favor_attention(q, q, v, w, o); }).find("fit"), std::string::npos);
  EXPECT_NE(message([&] {
              features(q, w, {Kernel::favorsharp, {}, {}});
            }).find("fit"),
            std::string::npos);
  EXPECT_NE(message([&] {
              Decoder(1, 2, 3, w, {Kernel::favorpp, {}, {}});
            }).find("fit"),
            std::string::npos);
  EXPECT_NE(message([&] { KernelFit::constant(0.125, 4); }).find("1/8"), std::string::npos);
  KernelFit wrong_heads =
      fit_kernel(Kernel::favorpp, random_tensor({1, 3, 5, 4}, 1), random_tensor({1, 3, 5, 4}, 2));
  o.fit = wrong_heads;
  EXPECT_NE(message([&] { favor_attention(q, q, v, w, o); }).find("heads"), std::string::npos);
  KernelFit skew = KernelFit::constant(-0.1, 4);
  skew.basis[1] = 0.5;
  o.fit = skew;
  EXPECT_NE(message([&] { favor_attention(q, q, v, w, o); }).find("orthonormal"),
            std::string::npos);
  o.fit = KernelFit::constant(-0.1, 5);
  EXPECT_NE(message([&] { favor_attention(q, q, v, w, o); }).find("head dim"), std::string::npos);
  EXPECT_NE(message([&] { fit_kernel(Kernel::positive, q, q); }).find("kernel"), std::string::npos);
}

}  // namespace
}  // namespace favor
