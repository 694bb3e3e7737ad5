// Feature maps (feature_map.hpp) through the forward paths: attention (bidirectional and
// causal, masked), features(), the decoder, against the double reference; the argument
// checks; and the saved context's fingerprint over the map. Rerun with
//   ./favor_tests --gtest_filter='FeatureMap*'
#include <gtest/gtest.h>

#include <vector>

#include "map_fixture.hpp"
#include "test_helpers.hpp"

// A namespace of its own: the unity build compiles several test files as one source
// (cmake/FavorUnity.cmake), and their helpers (Case, cases(), ...) share names.
namespace favor::test_feature_map {
namespace {
using testing::expect_error;
using testing::MapSpec;
using testing::random_map;
using testing::random_tensor;

struct Case {
  Kernel kernel;
  MapSpec spec;
  bool causal;
  bool masked;
};

std::string name_of(const Case& c) {
  return to_string(c.kernel) + "_" + testing::spec_name(c.spec) +
         (c.causal ? "_causal" : "_bidir") + (c.masked ? "_masked" : "");
}

void PrintTo(const Case& c, std::ostream* os) {
  *os << name_of(c);
}

class FeatureMapVsReference : public ::testing::TestWithParam<Case> {};

TEST_P(FeatureMapVsReference, WithinTwiceNaiveFloatError) {
  const Case c = GetParam();
  // B*H = 6 heads (one task each with 2 threads); N crosses the causal chunk (32) and, for
  // the keys of bidirectional attention, is not a multiple of anything; m odd.
  const int64_t B = 2, H = 3, N = 150, Nk = c.causal ? N : 97, D = 16, Dv = 8, m = 23;
  const Tensor q = random_tensor({B, H, N, D}, 1, 1.0);
  const Tensor k = random_tensor({B, H, Nk, D}, 2, 1.0);
  const Tensor v = random_tensor({B, H, Nk, Dv}, 3);
  const Projection w = Projection::draw(m, D, {ProjectionKind::orthogonal, NormMode::chi, 7});
  const FeatureMap map = random_map(c.kernel, w, c.spec, 11);
  std::vector<uint8_t> mask = testing::periodic_mask(static_cast<size_t>(B * Nk), 3, 1);
  AttentionOptions o;
  o.causal = c.causal;
  if (c.masked) o.key_mask = KeyMaskView::contiguous(mask.data(), B, Nk);
  AttentionStats stats;
  testing::expect_near_reference(q, k, v, map, o, name_of(c), &stats);
  // Trig features take both signs: a row's estimated denominator may be <= 0 (zeros).
  if (c.kernel != Kernel::trig) EXPECT_EQ(stats.zero_rows, 0);
}

std::vector<Case> cases() {
  const int64_t H = 3, BH = 6;
  const std::vector<MapSpec> specs = {
      {1, false, false, false},  // the fixed map (hedgehog: W of the projection, no bias)
      {1, false, false, true},   // lambda, shared
      {H, false, false, true},   // lambda per head
      {BH, false, false, true},  // lambda per (batch, head)
      {1, false, true, false},   // bias
      {H, true, false, false},   // learned W per head
      {H, true, true, true},     // all three per head
      {BH, true, true, true},    // all three per (batch, head)
  };
  std::vector<Case> out;
  for (Kernel kernel : {Kernel::positive, Kernel::trig, Kernel::hyperbolic, Kernel::hedgehog})
    for (size_t s = 0; s < specs.size(); ++s)
      for (bool causal : {false, true}) out.push_back({kernel, specs[s], causal, s % 2 == 1});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Maps, FeatureMapVsReference, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return name_of(info.param); });

TEST(FeatureMap, ProjectionOverloadIsTheMapOfIt) {
  // The Projection overload is FeatureMap{w, options.kernel}: the same bits.
  const Tensor q = random_tensor({1, 2, 40, 8}, 1, 1.0), k = random_tensor({1, 2, 40, 8}, 2, 1.0),
               v = random_tensor({1, 2, 40, 4}, 3);
  const Projection w = Projection::draw(16, 8);
  for (bool causal : {false, true}) {
    AttentionOptions o;
    o.kernel = Kernel::hyperbolic;
    o.causal = causal;
    AttentionOptions mo;
    mo.causal = causal;
    EXPECT_EQ(favor_attention(q, k, v, w, o).values(),
              favor_attention(q, k, v, FeatureMap(w, Kernel::hyperbolic), mo).values());
  }
}

TEST(FeatureMap, FeaturesMatchReference) {
  // features(x, map) against reference::features(x, map), element by element, relative to
  // the entry (positive, hyperbolic, hedgehog) or to the row's largest entry (trig: sin and
  // cos cross zero). The exponent a + b - |x|^2/2 carries ~D ulps of its terms (|a| <~ 4
  // here) and the bias add and lambda product one ulp each: 64 * 2^-24 ~ 4e-6 covers it, as
  // for the fixed maps (test_features.cpp).
  const int64_t B = 2, H = 3, D = 9;
  const Tensor x = random_tensor({B, H, 130, D}, 5, 1.5);
  const Projection w = Projection::draw(21, D, {ProjectionKind::orthogonal, NormMode::chi, 2});
  for (Kernel kernel : {Kernel::positive, Kernel::trig, Kernel::hyperbolic, Kernel::hedgehog})
    for (const MapSpec& spec : {MapSpec{1, false, false, false}, MapSpec{1, false, false, true},
                                MapSpec{H, true, true, true}, MapSpec{B * H, true, true, true}}) {
      const FeatureMap map = random_map(kernel, w, spec, 3);
      const Tensor fast = features(x, map);
      const auto ref = reference::features(x, map);
      ASSERT_EQ(fast.shape(), ref.shape);
      EXPECT_LE(testing::worst_feature_error(fast, ref, kernel == Kernel::trig), 4e-6)
          << to_string(kernel) << " " << testing::spec_name(spec);
    }
}

TEST(FeatureMap, ReferenceFeaturesCarryLambdaOnBothSides) {
  // The reference's phi(q).phi(k) with lambda equals the unweighted map's with lambda_f^2
  // on every product of row f (feature_map.hpp): checked on the hedgehog map.
  const Tensor x = random_tensor({1, 1, 3, 4}, 9, 1.0);
  const Projection w = Projection::draw(5, 4);
  const FeatureMap weighted = random_map(Kernel::hedgehog, w, {1, false, false, true}, 4);
  const auto a = reference::features(x, weighted);
  const auto u = reference::features(x, FeatureMap(w, Kernel::hedgehog));
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t f = 0; f < 10; ++f)
      EXPECT_NEAR(a.at(0, 0, i, f), weighted.lambda[f % 5] * u.at(0, 0, i, f),
                  1e-15 * std::abs(u.at(0, 0, i, f)));
}

class FeatureMapDecoder : public ::testing::TestWithParam<std::tuple<Kernel, int>> {};

TEST_P(FeatureMapDecoder, EqualsCausalAttention) {
  // Token by token, and in groups (a prefill of 70 tokens, single tokens, a group of 9 in the
  // middle), the decoder with a learned map gives the rows of causal favor_attention with the
  // same map. As test_streaming.cpp: both are float32 evaluations of one formula in different
  // orders, each within ~(N + F) * 2^-24 of it: 1e-5 relative (Frobenius).
  const auto [kernel, which] = GetParam();
  const int64_t B = 2, H = 3, N = 120, D = 16, Dv = 8;
  const Tensor q = random_tensor({B, H, N, D}, 21, 1.2), k = random_tensor({B, H, N, D}, 22, 1.2),
               v = random_tensor({B, H, N, Dv}, 23);
  const Projection w = Projection::draw(24, D, {ProjectionKind::orthogonal, NormMode::chi, 9});
  const MapSpec spec = which == 0   ? MapSpec{1, false, false, true}
                       : which == 1 ? MapSpec{H, true, true, false}
                                    : MapSpec{B * H, true, true, true};
  const FeatureMap map = random_map(kernel, w, spec, 31);
  AttentionOptions o;
  o.causal = true;
  const Tensor batch = favor_attention(q, k, v, map, o);
  for (const std::vector<int64_t>& groups : {std::vector<int64_t>{}, {70, 1, 1, 9, 1, 1, 17}}) {
    Decoder dec(B, H, Dv, map);
    std::vector<int64_t> rows;
    const Tensor streamed = testing::decode(dec, q, k, v, groups, &rows);
    EXPECT_EQ(dec.position(), N);
    EXPECT_LE(testing::rows_rel_error(streamed, batch, rows), 1e-5)
        << to_string(kernel) << " " << testing::spec_name(spec) << " groups " << groups.size();
  }
}

INSTANTIATE_TEST_SUITE_P(Maps, FeatureMapDecoder,
                         ::testing::Combine(::testing::Values(Kernel::positive, Kernel::hyperbolic,
                                                              Kernel::trig, Kernel::hedgehog),
                                            ::testing::Values(0, 1, 2)),
                         [](const auto& info) {
                           return to_string(std::get<0>(info.param)) + "_" +
                                  std::to_string(std::get<1>(info.param));
                         });

TEST(FeatureMap, ArgumentErrorsNameTheArgument) {
  const int64_t B = 2, H = 3, D = 8;
  const Tensor q = random_tensor({B, H, 10, D}, 1), k = random_tensor({B, H, 10, D}, 2),
               v = random_tensor({B, H, 10, 4}, 3);
  const Projection w = Projection::draw(16, D);
  auto attend = [&](const FeatureMap& map, const AttentionOptions& o = {}) {
    return [&q, &k, &v, map, o] { favor_attention(q, k, v, map, o); };
  };

  FeatureMap heads(w);
  heads.learnable(2);  // neither 1, H = 3 nor B*H = 6
  expect_error(attend(heads), "map.heads = 2");
  expect_error([&] { Decoder(B, H, 4, heads); }, "map.heads = 2");
  expect_error([&] { features(q, heads); }, "map.heads = 2");

  FeatureMap zero_lambda(w);
  zero_lambda.learnable(H, false, false, true);
  zero_lambda.lambda[5] = 0.0f;
  expect_error(attend(zero_lambda), "map.lambda[5]");
  expect_error([&] { Decoder(B, H, 4, zero_lambda); }, "map.lambda[5]");
  FeatureMap nan_bias(w);
  nan_bias.learnable(1, false, true, false);
  nan_bias.bias[0] = NAN;
  expect_error(attend(nan_bias), "map.bias[0]");

  FeatureMap short_weights(w);
  short_weights.learnable(H, true, false, false);
  short_weights.weights.pop_back();
  expect_error(attend(short_weights), "map.weights");
  FeatureMap short_lambda(w);
  short_lambda.lambda.assign(15, 1.0f);  // m = 16
  expect_error(attend(short_lambda), "map.lambda");

  FeatureMap plusplus(w, Kernel::favorpp);
  plusplus.lambda.assign(16, 1.0f);
  expect_error(attend(plusplus), "map: a favorpp map");
  FeatureMap sharp(w, Kernel::favorsharp);
  sharp.fit = KernelFit::constant(0.0, D);
  sharp.bias.assign(16, 0.0f);
  expect_error([&] { Decoder(B, H, 4, sharp); }, "map: a favorsharp map");
  expect_error([&] { FeatureMap(w, Kernel::favorpp).learnable(1); }, "kernel: favorpp");

  expect_error(attend(FeatureMap(w), AttentionOptions{Kernel::trig}), "options:");
  AttentionOptions scaled;
  scaled.scale = 0.5;
  expect_error(attend(FeatureMap(w), scaled), "options:");
  expect_error(
      [&] {
        DecoderOptions o;
        o.kernel = Kernel::hyperbolic;
        Decoder(B, H, 4, FeatureMap(w), o);
      },
      "options:");
  expect_error([&] { favor_attention_backward(q, k, v, v, FeatureMap(w), scaled); }, "options:");
  // The reference refuses the same maps (it is the oracle, not a looser path).
  expect_error([&] { reference::favor_attention(q, k, v, heads); }, "map.heads = 2");
  expect_error([&] { reference::favor_attention(q, k, v, zero_lambda); }, "map.lambda[5]");
  expect_error([&] { reference::favor_attention(q, k, v, FeatureMap(w), scaled); }, "options:");
  expect_error([&] { reference::features(q, plusplus); }, "map: a favorpp map");
}

TEST(FeatureMap, ContextFromAnotherLambdaIsRefused) {
  // The saved context's fingerprint covers the map: a backward call with other feature
  // weights (same k, v, W) refuses it; the same map accepts it.
  const int64_t B = 1, H = 2, N = 30, D = 8;
  const Tensor q = random_tensor({B, H, N, D}, 1, 1.0), k = random_tensor({B, H, N, D}, 2, 1.0),
               v = random_tensor({B, H, N, 4}, 3), dy = random_tensor({B, H, N, 4}, 4);
  const Projection w = Projection::draw(16, D);
  const FeatureMap map = random_map(Kernel::positive, w, {H, false, false, true}, 5);
  FeatureMap other = map;
  other.lambda[3] *= 1.5f;
  Tensor y({B, H, N, 4});
  AttentionContext ctx;
  favor_attention(q, k, v, map, y.mutable_view(), {}, &ctx);
  ASSERT_TRUE(ctx.valid());
  expect_error([&] { favor_attention_backward(q, k, v, dy, other, {}, false, &ctx); }, "context:");
  FeatureMap unweighted(w);
  expect_error([&] { favor_attention_backward(q, k, v, dy, unweighted, {}, false, &ctx); },
               "context:");
  const AttentionGrads with = favor_attention_backward(q, k, v, dy, map, {}, false, &ctx);
  const AttentionGrads without = favor_attention_backward(q, k, v, dy, map, {}, false);
  // Equal up to the summation order of the saved state (as test_backward.cpp).
  EXPECT_LE(relative_frobenius_error(with.dq, without.dq), 1e-6);
  EXPECT_LE(relative_frobenius_error(with.dk, without.dk), 1e-6);
}

}  // namespace
}  // namespace favor::test_feature_map

namespace favor::testing {
namespace {

// learnable() validates what it widens: bad sets counts and sizes throw, never crash.
TEST(FeatureMap, LearnableRefusesBadParametersBeforeWideningThem) {
  const Projection w = Projection::draw(4, 3);
  FeatureMap zero_sets(w);
  zero_sets.bias.assign(4, 0.0f);
  zero_sets.heads = 0;
  expect_error([&] { zero_sets.learnable(2); }, "heads");
  FeatureMap short_weights(w);
  short_weights.weights.assign(5, 0.0f);
  expect_error([&] { short_weights.learnable(2); }, "weights");
  FeatureMap zero_lambda(w);
  zero_lambda.lambda.assign(4, 0.0f);
  expect_error([&] { zero_lambda.learnable(2); }, "lambda");
  expect_error([&] { FeatureMap(w).learnable(0); }, "heads");
}

// Huge and tiny feature weights: lambda^2 is formed in the exponent (log lambda^2 added to the
// key's log-features), so |lambda| = 1e20 (lambda^2 beyond float) and 1e-20 stay exact for
// every kernel, trig included.
TEST(FeatureMap, ExtremeFeatureWeightsStayExact) {
  const Tensor q = random_tensor({1, 2, 24, 8}, 3, 1.0), k = random_tensor({1, 2, 24, 8}, 4, 1.0),
               v = random_tensor({1, 2, 24, 5}, 5);
  const Projection w = Projection::draw(6, 8);
  for (Kernel kernel : {Kernel::positive, Kernel::trig, Kernel::hyperbolic, Kernel::hedgehog}) {
    for (bool causal : {false, true}) {
      FeatureMap map(w, kernel);
      map.lambda = {1e20f, 1.0f, 1e-20f, 2.0f, 1e20f, 0.5f};
      AttentionOptions o;
      o.causal = causal;
      const Tensor y = expect_near_reference(q, k, v, map, o, to_string(kernel));
      for (int64_t i = 0; i < y.numel(); ++i) ASSERT_TRUE(std::isfinite(y.data()[i]));
    }
  }
}

}  // namespace
}  // namespace favor::testing
