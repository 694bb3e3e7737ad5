// Numerical stability: large norms give finite outputs, and the stabilised kernels equal
// the unstabilised formula wherever that formula is finite.
#include <gtest/gtest.h>

#include "reference/naive.hpp"
#include "test_helpers.hpp"

namespace favor {
namespace {
using testing::random_tensor;

// With positive features the output is a convex combination of value rows: every output
// element lies within [min_j v, max_j v] of its head. Checks finiteness too.
void expect_convex(const Tensor& y, const Tensor& v) {
  const auto& s = y.shape();
  for (int64_t b = 0; b < s[0]; ++b)
    for (int64_t h = 0; h < s[1]; ++h)
      for (int64_t x = 0; x < s[3]; ++x) {
        float lo = INFINITY, hi = -INFINITY;
        for (int64_t j = 0; j < v.shape()[2]; ++j) {
          lo = std::min(lo, v.at(b, h, j, x));
          hi = std::max(hi, v.at(b, h, j, x));
        }
        for (int64_t i = 0; i < s[2]; ++i) {
          const float e = y.at(b, h, i, x);
          ASSERT_TRUE(std::isfinite(e));
          ASSERT_GE(e, lo - 1e-5f * std::abs(lo));
          ASSERT_LE(e, hi + 1e-5f * std::abs(hi));
        }
      }
}

class LargeNorms : public ::testing::TestWithParam<std::tuple<Kernel, double>> {};

TEST_P(LargeNorms, FiniteAndConvex) {
  const auto [kernel, norm] = GetParam();
  const int64_t B = 1, H = 2, N = 200, D = 64, Dv = 16;
  const Tensor q = random_tensor({B, H, N, D}, 1, norm), k = random_tensor({B, H, N, D}, 2, norm),
               v = random_tensor({B, H, N, Dv}, 3);
  const Projection w = Projection::draw(128, D, {ProjectionKind::orthogonal, NormMode::chi, 3});
  for (bool causal : {false, true}) {
    AttentionOptions o;
    o.kernel = kernel;
    o.causal = causal;
    AttentionStats stats;
    const Tensor y = favor_attention(q, k, v, w, o, &stats);
    if (kernel == Kernel::trig) {
      for (float e : y.values()) ASSERT_TRUE(std::isfinite(e));
    } else {
      expect_convex(y, v);
      EXPECT_EQ(stats.zero_rows, 0) << "causal " << causal;
    }
  }
  Decoder dec(B, H, Dv, w, {kernel, std::nullopt});
  dec.append(k, v);
  const Tensor y = dec.query(q);
  if (kernel != Kernel::trig) expect_convex(y, v);
  for (float e : y.values()) ASSERT_TRUE(std::isfinite(e));
  // Exact attention is stable at these norms too.
  for (bool causal : {false, true}) {
    ExactOptions eo;
    eo.causal = causal;
    expect_convex(exact_attention(q, k, v, eo), v);
  }
}

INSTANTIATE_TEST_SUITE_P(Norms, LargeNorms,
                         ::testing::Combine(::testing::Values(Kernel::positive, Kernel::hyperbolic,
                                                              Kernel::trig),
                                            ::testing::Values(30.0, 1e3)),
                         [](const auto& info) {
                           return to_string(std::get<0>(info.param)) + "_norm" +
                                  std::to_string(int(std::get<1>(info.param)));
                         });

TEST(Stability, EqualsUnstabilisedFormulaWhereFinite) {
  // Norms up to 9 with D = 16 (|x|^2/2 up to 10): the unstabilised double formula is
  // finite. The stabilised float32 kernels shift exponents by up to E = max |log phi| ~ 40;
  // an exponent computed in float32 carries ~E * 2^-24 absolute error, i.e. a relative
  // error of the features of E * 2^-24 ~ 2.4e-6, and a naive float32 evaluation of the same
  // formula shows that error too: the 2x-naive rule applies.
  const Tensor q = random_tensor({1, 2, 100, 16}, 7, 6.0),
               k = random_tensor({1, 2, 100, 16}, 8, 6.0), v = random_tensor({1, 2, 100, 8}, 9);
  const Projection w = Projection::draw(64, 16, {ProjectionKind::orthogonal, NormMode::chi, 1});
  for (bool causal : {false, true}) {
    AttentionOptions o;
    o.causal = causal;
    const Tensor fast = favor_attention(q, k, v, w, o);
    const auto ref = reference::favor_attention(q, k, v, w, o);
    o.scale = 0.25;
    const auto naive32 = reference::naive::favor_attention<float>(q, k, v, w, o);
    for (float e : naive32) ASSERT_TRUE(std::isfinite(e));
    EXPECT_LE(testing::rel_error(fast, ref.values),
              2 * testing::rel_error(naive32, ref.values) + 1e-6);
  }
}

TEST(Stability, BeyondFloatRangeMatchesDoubleReference) {
  // Norms ~25 (|x|^2/2 up to ~175): unstabilised float32 features overflow (exp > 88.7),
  // double does not. Exponent magnitudes reach E ~ 250, so features carry ~E * 2^-24 ~ 1.5e-5
  // relative error; outputs are ratios of such sums: bound 4 E 2^-24 = 6e-5.
  const Tensor q = random_tensor({1, 1, 80, 16}, 17, 25.0),
               k = random_tensor({1, 1, 80, 16}, 18, 25.0), v = random_tensor({1, 1, 80, 8}, 19);
  const Projection w = Projection::draw(64, 16, {ProjectionKind::orthogonal, NormMode::chi, 1});
  for (bool causal : {false, true}) {
    AttentionOptions o;
    o.causal = causal;
    const Tensor fast = favor_attention(q, k, v, w, o);
    const auto ref = reference::favor_attention(q, k, v, w, o);
    for (double e : ref.values) ASSERT_TRUE(std::isfinite(e));
    EXPECT_LE(testing::rel_error(fast, ref.values), 6e-5) << "causal " << causal;
  }
}

TEST(Stability, ExactAttentionBeyondFloatLogitsIsFinite) {
  // Finite inputs whose float32 logits or value sums overflow (scale |q| |k| or Nk max|v|
  // beyond 1e38) gave NaN (inf - inf in the online softmax) or inf with f32 accumulation
  // (found by python/tests/test_properties_inputs.py); they now take the double path.
  // Entries 1e20: logits ~1e40. Values 3e38 (the average of 3e38 and -3e38 and 1e38 is
  // representable, their float32 sum is not).
  for (const float big : {1e20f, 3e30f}) {
    Tensor q({1, 1, 3, 2}), v({1, 1, 3, 1});
    for (int64_t i = 0; i < 3; ++i) {
      q.at(0, 0, i, 0) = big * float(i + 1);
      q.at(0, 0, i, 1) = -big;
      v.at(0, 0, i, 0) = float(i);
    }
    for (bool causal : {false, true}) {
      ExactOptions o;
      o.causal = causal;
      const Tensor y = exact_attention(q, q, v, o);
      o.accumulation = Accumulation::f64;
      const Tensor y64 = exact_attention(q, q, v, o);
      for (int64_t i = 0; i < 3; ++i) {
        ASSERT_TRUE(std::isfinite(y.at(0, 0, i, 0))) << big << " row " << i;
        EXPECT_EQ(y.at(0, 0, i, 0), y64.at(0, 0, i, 0)) << big << " row " << i;
      }
    }
  }
  Tensor q({1, 1, 3, 2}), v({1, 1, 3, 1});
  const float vals[3] = {3e38f, 3e38f, -1e38f};
  for (int64_t i = 0; i < 3; ++i) v.at(0, 0, i, 0) = vals[i];  // q = 0: uniform weights
  const Tensor y = exact_attention(q, q, v, ExactOptions{});
  for (float e : y.values()) {
    ASSERT_TRUE(std::isfinite(e));
    EXPECT_NEAR(e, (3e38 + 3e38 - 1e38) / 3, 1e32);
  }
}

}  // namespace
}  // namespace favor

namespace favor {
namespace {

// FAVOR# at scale 4 with values of a few units (found by fuzz_attention,
// fuzz/regressions/attention/favorsharp_backward_dk_nan.bin): a query's stabilised feature
// reaches 1 / s_f where the key sum s_f is tiny, and R = phi(Q)^T gx overflowed float, so dk
// was NaN while the forward was finite. The backward now keeps R scaled by s. The gradients
// match the double reference: features with exponents E ~ scale |w| |x| ~ 100 carry
// E * 2^-24 relative error each, and the gradients are sums of products of such terms:
// bound 1e-3 of the largest reference magnitude.
TEST(Stability, FavorSharpBackwardWithTinyKeySumsIsFinite) {
  Tensor q({1, 2, 4, 3}), k({1, 2, 4, 3}), v({1, 2, 4, 3}), dy({1, 2, 4, 3});
  const float keys[24] = {-3, -2,   0,      0.3f, -1.75f, -3, -2,   0,      0.3f, -1.75f, -3, -2,
                          0,  0.3f, -1.75f, -3,   -2,     0,  0.3f, -1.75f, -3,   -2,     0,  0.3f};
  const float upstream[6] = {0.75f, -2, 0.5f, 3.25f, 2.5f, 0};
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t n = 0; n < 4; ++n)
      for (int64_t x = 0; x < 3; ++x) {
        q.at(0, h, n, x) = h ? 4.0f : 1.5f;
        k.at(0, h, n, x) = keys[h * 12 + n * 3 + x];
        v.at(0, h, n, x) = (n * 3 + x) % 2 ? 1.0f : 3.25f;
        dy.at(0, h, n, x) = upstream[(h * 25 + n * 3 + x) % 6];
      }
  const Projection w =
      Projection::from_matrix(4, 3, {-2, 1.5f, -2, 1.5f, -2, 1.5f, -2, 1.5f, -2, 1.5f, -2, 1.5f});
  AttentionOptions o;
  o.kernel = Kernel::favorsharp;
  o.scale = 4.0;
  const AttentionGrads g = favor_attention_backward(q, k, v, dy, w, o, false);
  const reference::DGrads ref = reference::favor_attention_backward(q, k, v, dy, w, o);
  for (const auto& [fast, exact, name] :
       {std::tuple{&g.dq, &ref.dq, "dq"}, std::tuple{&g.dk, &ref.dk, "dk"},
        std::tuple{&g.dv, &ref.dv, "dv"}}) {
    for (float x : fast->values()) ASSERT_TRUE(std::isfinite(x)) << name;
    EXPECT_LE(testing::rel_error(*fast, exact->values), 1e-3) << name;
  }
}

// q, k, v, dy [1, 1, n, 3] in [-3, 3] and W (4 x 3) in [-3, 4], multiples of 1/16, from the
// library's portable generator.
struct SmallCase {
  Tensor q, k, v, dy;
  Projection w;
};
SmallCase small_case(uint64_t seed, int64_t n) {
  detail::Rng rng(seed, 27);
  const auto draw = [&](double lo, double hi) {
    return static_cast<float>(std::round((lo + (hi - lo) * rng.uniform_open()) * 16.0) / 16.0);
  };
  std::vector<float> wv(12);
  for (float& x : wv) x = draw(-3.0, 4.0);
  SmallCase c{Tensor({1, 1, n, 3}), Tensor({1, 1, n, 3}), Tensor({1, 1, n, 3}),
              Tensor({1, 1, n, 3}), Projection::from_matrix(4, 3, wv)};
  for (Tensor* t : {&c.q, &c.k, &c.v, &c.dy})
    for (float& x : t->values()) x = draw(-3.0, 3.0);
  return c;
}

// The causal form of the finding above (docs/numerics.md, "Causal backward"): the prefix
// key sums of a feature stay tiny, the query features reach 1 / P and R = phi(Q)^T gx and
// D^T phi(Q) overflowed float (dk NaN; 4 of 3000 such seeds for FAVOR++, 9 for FAVOR#, all
// finite since). N = 40 spans two 32-token chunks.
TEST(Stability, CausalFavorBackwardWithTinyPrefixSumsIsFinite) {
  for (const auto& [kernel, seed] :
       {std::pair{Kernel::favorpp, 847}, std::pair{Kernel::favorpp, 962},
        std::pair{Kernel::favorsharp, 254}, std::pair{Kernel::favorsharp, 1474}}) {
    const SmallCase c = small_case(static_cast<uint64_t>(seed), 40);
    AttentionOptions o;
    o.kernel = kernel;
    o.scale = 4.0;
    o.fit = fit_kernel(kernel, c.q, c.k, 4.0);
    o.causal = true;
    const AttentionGrads g = favor_attention_backward(c.q, c.k, c.v, c.dy, c.w, o, false);
    const reference::DGrads ref = reference::favor_attention_backward(c.q, c.k, c.v, c.dy, c.w, o);
    for (const auto& [fast, exact, name] :
         {std::tuple{&g.dq, &ref.dq, "dq"}, std::tuple{&g.dk, &ref.dk, "dk"},
          std::tuple{&g.dv, &ref.dv, "dv"}}) {
      for (float x : fast->values()) ASSERT_TRUE(std::isfinite(x)) << name << " seed " << seed;
      EXPECT_LE(testing::rel_error(*fast, exact->values), 1e-3) << name << " seed " << seed;
    }
  }
}

}  // namespace
}  // namespace favor
