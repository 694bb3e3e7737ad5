// fit_features (fit.hpp): distillation of learned feature maps against exact attention. On
// data with structure (queries and keys from a low-rank anisotropic distribution) fitting a
// Hedgehog map lowers the held-out attention error, at the end and on average over the
// curve; the fit is deterministic; the history and callback follow eval_every; bad inputs
// throw naming the argument. The lambda test needs the backward kernels' dL/dlambda.
// Rerun one with build/tests/favor_tests --gtest_filter='Fit.<Name>'
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "test_helpers.hpp"

namespace favor {
namespace {
using testing::expect_error;
using testing::random_tensor;

constexpr int64_t kHeads = 2, kD = 16, kDv = 8;

// Rows x = gain * z A + 0.1 e per head: z ~ N(0, I_r), A [r, D] a fixed per-head basis of
// rows N(0, I_D / D) scaled by 1 / (1 + r) (anisotropic, effective rank r), e ~ N(0, I_D).
// With gain 3 and scale 1/sqrt(D) the logits have a spread of a few units: peaked attention,
// far from what random features estimate well. Queries and keys of train and held-out
// sequences share the bases: the same distribution, other draws.
Tensor structured(int64_t batch, int64_t n, uint64_t seed, double gain) {
  constexpr int64_t rank = 4;
  const Tensor basis = random_tensor({1, kHeads, rank, kD}, 99);
  const Tensor z = random_tensor({batch, kHeads, n, rank}, seed);
  const Tensor noise = random_tensor({batch, kHeads, n, kD}, seed + 1000);
  Tensor x({batch, kHeads, n, kD});
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < kHeads; ++h)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t c = 0; c < kD; ++c) {
          double s = 0.1 * noise.at(b, h, i, c);
          for (int64_t r = 0; r < rank; ++r)
            s += gain * z.at(b, h, i, r) * basis.at(0, h, r, c) / ((1.0 + r) * std::sqrt(kD));
          x.at(b, h, i, c) = static_cast<float>(s);
        }
  return x;
}

struct Data {
  Tensor q, k, v;
  FitData view() const { return {q, k, v, std::nullopt}; }
};

Data make_data(int64_t batch, int64_t n, uint64_t seed) {
  return {structured(batch, n, seed, 3.0), structured(batch, n, seed + 1, 3.0),
          random_tensor({batch, kHeads, n, kDv}, seed + 2)};
}

FeatureMap hedgehog(int64_t m, uint64_t seed = 5) {
  return FeatureMap(Projection::draw(m, kD, {ProjectionKind::orthogonal, NormMode::chi, seed}),
                    Kernel::hedgehog);
}

double mean(const std::vector<FitStep>& h, size_t from, size_t to) {
  double s = 0.0;
  for (size_t i = from; i < to; ++i) s += h[i].heldout_error;
  return s / static_cast<double>(to - from);
}

// The held-out curve of a fit: the last point below the first, and the mean over the second
// half of the steps below the mean over the first half (monotone on average).
void expect_fit_improves(const FitResult& r, int steps) {
  ASSERT_EQ(r.history.size(), static_cast<size_t>(steps + 1));
  const auto& h = r.history;
  const size_t half = h.size() / 2;
  EXPECT_LT(h.back().heldout_error, h.front().heldout_error);
  EXPECT_LT(mean(h, half, h.size()), mean(h, 0, half));
  EXPECT_LT(h.back().loss, h.front().loss);
  for (size_t i = 0; i < h.size(); ++i) {
    EXPECT_EQ(h[i].step, static_cast<int>(i));
    EXPECT_TRUE(std::isfinite(h[i].loss) && std::isfinite(h[i].heldout_error));
    if (i) EXPECT_GE(h[i].seconds, h[i - 1].seconds);
  }
}

// Hedgehog W and b per head, m = 16 and 64: the held-out error falls (by a clear margin: the
// random start is far from softmax on structured data), and the map has H sets of W and b.
TEST(Fit, HedgehogLowersHeldoutError) {
  const Data train = make_data(4, 64, 10), heldout = make_data(2, 64, 20);
  for (int64_t m : {16, 64}) {
    FitOptions o;
    o.steps = 60;
    o.learning_rate = 0.02;
    o.learn_lambda = false;
    const FitResult r = fit_features(train.view(), heldout.view(), hedgehog(m), o);
    expect_fit_improves(r, o.steps);
    const auto& h = r.history;
    EXPECT_LT(h.back().heldout_error, 0.8 * h.front().heldout_error)
        << "m " << m << ": " << h.front().heldout_error << " -> " << h.back().heldout_error;
    EXPECT_EQ(r.map.heads, kHeads);
    EXPECT_EQ(r.map.weights.size(), static_cast<size_t>(kHeads * m * kD));
    EXPECT_EQ(r.map.bias.size(), static_cast<size_t>(kHeads * m));
    EXPECT_TRUE(r.map.lambda.empty());  // not learned, not created
    EXPECT_EQ(r.map.kernel, Kernel::hedgehog);
  }
}

// Causal attention with a key mask, and the positive kernel learning W alone.
TEST(Fit, CausalMaskedAndPositiveLowerHeldoutError) {
  const Data train = make_data(3, 48, 30), heldout = make_data(2, 48, 40);
  const std::vector<uint8_t> mask = [] {
    std::vector<uint8_t> m = testing::periodic_mask(3 * 48, 5, 2);
    m[0] = 1;  // every causal prefix sees a key
    return m;
  }();
  FitData t = train.view();
  t.key_mask = KeyMaskView::contiguous(mask.data(), 3, 48);
  FitOptions o;
  o.steps = 40;
  o.learning_rate = 0.02;
  o.causal = true;
  o.learn_lambda = false;
  expect_fit_improves(fit_features(t, heldout.view(), hedgehog(32), o), o.steps);

  FitOptions p;
  p.steps = 40;
  p.learning_rate = 0.02;
  p.learn_bias = p.learn_lambda = false;
  const FeatureMap positive(
      Projection::draw(16, kD, {ProjectionKind::orthogonal, NormMode::chi, 7}));
  const FitResult r = fit_features(train.view(), heldout.view(), positive, p);
  expect_fit_improves(r, p.steps);
  EXPECT_TRUE(r.map.bias.empty());
}

// Step 0 is the starting map (made learnable: W from the projection, b = 0, lambda = 1, which
// changes nothing): its held-out error is that of favor_attention with the start.
TEST(Fit, StepZeroIsTheStartingMap) {
  const Data train = make_data(2, 32, 50), heldout = make_data(1, 32, 60);
  const FeatureMap start = hedgehog(16);
  FitOptions o;
  o.steps = 0;
  const FitResult r = fit_features(train.view(), heldout.view(), start, o);
  ASSERT_EQ(r.history.size(), 1u);
  const double expected =
      relative_frobenius_error(favor_attention(heldout.q, heldout.k, heldout.v, start),
                               exact_attention(heldout.q, heldout.k, heldout.v));
  // Float outputs of two equal maps through different parameter paths, against targets
  // accumulated in f32 vs f64: agreement to a few float roundings of an O(1) error.
  EXPECT_NEAR(r.history[0].heldout_error, expected, 1e-5 * expected);
  EXPECT_EQ(r.map.weights, [&] {
    std::vector<float> w(start.projection.matrix());
    w.insert(w.end(), start.projection.matrix().begin(), start.projection.matrix().end());
    return w;
  }());
}

// The same inputs give the same map and history, bit for bit; on_step sees the evaluated
// steps (0, every eval_every, the last) as the history records them.
TEST(Fit, DeterministicAndEvaluatesEveryEvalEvery) {
  const Data train = make_data(2, 40, 70), heldout = make_data(1, 40, 80);
  FitOptions o;
  o.steps = 10;
  o.eval_every = 4;
  std::vector<int> seen;
  const FitResult a = fit_features(train.view(), heldout.view(), hedgehog(16), o,
                                   [&](const FitStep& s) { seen.push_back(s.step); });
  const FitResult b = fit_features(train.view(), heldout.view(), hedgehog(16), o);
  EXPECT_EQ(seen, (std::vector<int>{0, 4, 8, 10}));
  ASSERT_EQ(a.history.size(), 4u);
  ASSERT_EQ(b.history.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(a.history[i].step, seen[i]);
    EXPECT_EQ(a.history[i].loss, b.history[i].loss);
    EXPECT_EQ(a.history[i].heldout_error, b.history[i].heldout_error);
  }
  EXPECT_EQ(a.map.weights, b.map.weights);
  EXPECT_EQ(a.map.bias, b.map.bias);
  EXPECT_EQ(a.map.lambda, b.map.lambda);
  o.eval_every = 0;
  EXPECT_EQ(fit_features(train.view(), heldout.view(), hedgehog(16), o).history.size(), 2u);
}

// A map whose parameters are one set shared by every head sums its gradients over heads: that
// sum is formed in head order, not per thread, so reruns on several threads give the same bits
// (each (batch, head) may run on any thread).
TEST(Fit, SharedParametersGiveTheSameBitsOnEveryRerun) {
  const testing::ThreadCount saved;
  set_num_threads(2);
  const Data train = make_data(4, 40, 71), heldout = make_data(1, 40, 81);
  FitOptions o;
  o.steps = 6;
  FeatureMap start = hedgehog(16);
  start.learnable(1);
  const FitResult first = fit_features(train.view(), heldout.view(), start, o);
  ASSERT_EQ(first.map.heads, 1);
  for (int rerun = 0; rerun < 4; ++rerun) {
    const FitResult again = fit_features(train.view(), heldout.view(), start, o);
    EXPECT_EQ(again.map.weights, first.map.weights) << "rerun " << rerun;
    EXPECT_EQ(again.map.bias, first.map.bias) << "rerun " << rerun;
    EXPECT_EQ(again.history.back().loss, first.history.back().loss) << "rerun " << rerun;
  }
}

// Learning lambda alone (W, b fixed) lowers the held-out error of a positive map and keeps
// every |lambda| >= the floor. NEEDS the backward kernels' dL/dlambda (BackwardParams::dlogw):
// with a zero gradient lambda never moves and this test fails.
TEST(Fit, LambdaAloneLowersHeldoutError) {
  const Data train = make_data(4, 64, 90), heldout = make_data(2, 64, 100);
  FitOptions o;
  o.steps = 60;
  o.learning_rate = 0.05;
  o.learn_weights = o.learn_bias = false;
  o.lambda_floor = 0.05;
  const FeatureMap start(Projection::draw(16, kD, {ProjectionKind::iid, NormMode::chi, 3}));
  const FitResult r = fit_features(train.view(), heldout.view(), start, o);
  expect_fit_improves(r, o.steps);
  EXPECT_TRUE(r.map.weights.empty());
  EXPECT_TRUE(r.map.bias.empty());
  ASSERT_EQ(r.map.lambda.size(), static_cast<size_t>(kHeads * 16));
  bool moved = false;
  for (float l : r.map.lambda) {
    EXPECT_GE(std::fabs(l), 0.05f);
    moved = moved || l != 1.0f;
  }
  EXPECT_TRUE(moved);
}

TEST(Fit, BadInputsThrowNamingTheArgument) {
  const Data train = make_data(2, 16, 110), heldout = make_data(1, 16, 120);
  const FitOptions o;
  auto fit = [&](const FitData& t, const FitData& h, const FeatureMap& start,
                 const FitOptions& options) { fit_features(t, h, start, options); };
  // Shapes: within train, within heldout, and between them (H, D, Dv).
  const Tensor k8 = random_tensor({2, kHeads, 16, 8}, 1);
  expect_error(
      [&] {
        fit({train.q, k8, train.v, {}}, heldout.view(), hedgehog(8), o);
      },
      "train: q");
  expect_error(
      [&] {
        fit(train.view(), {heldout.q, heldout.k, train.v, {}}, hedgehog(8), o);
      },
      "heldout: q");
  const Tensor v3 = random_tensor({1, kHeads, 16, 3}, 2);
  expect_error(
      [&] {
        fit(train.view(), {heldout.q, heldout.k, v3, {}}, hedgehog(8), o);
      },
      "heldout: q");
  const Tensor q1 = random_tensor({1, 1, 16, kD}, 3), v1 = random_tensor({1, 1, 16, kDv}, 4);
  expect_error([&] { fit(train.view(), {q1, q1, v1, {}}, hedgehog(8), o); }, "same heads H");
  // The start: FAVOR++, per-sequence sets, the wrong D.
  FeatureMap favorpp(Projection::draw(8, kD), Kernel::favorpp);
  expect_error([&] { fit(train.view(), heldout.view(), favorpp, o); }, "start: a favorpp map");
  FeatureMap per_sequence = hedgehog(8);
  per_sequence.learnable(2 * kHeads);
  expect_error([&] { fit(train.view(), heldout.view(), per_sequence, o); }, "start.heads = 4");
  const FeatureMap wrong_d(Projection::draw(8, 4), Kernel::hedgehog);
  expect_error([&] { fit(train.view(), heldout.view(), wrong_d, o); },
               "start: projection is 8 x 4");
  // Options.
  FitOptions bad = o;
  bad.steps = -1;
  expect_error([&] { fit(train.view(), heldout.view(), hedgehog(8), bad); }, "options.steps");
  bad = o;
  bad.learning_rate = std::numeric_limits<double>::quiet_NaN();
  expect_error([&] { fit(train.view(), heldout.view(), hedgehog(8), bad); },
               "options.learning_rate");
  bad = o;
  bad.learn_weights = bad.learn_bias = bad.learn_lambda = false;
  expect_error([&] { fit(train.view(), heldout.view(), hedgehog(8), bad); }, "nothing to fit");
  bad = o;
  bad.lambda_floor = 0.0;
  expect_error([&] { fit(train.view(), heldout.view(), hedgehog(8), bad); },
               "options.lambda_floor");
  // A step so large that the update leaves float: named with its step.
  bad = o;
  bad.learning_rate = 1e300;
  expect_error([&] { fit(train.view(), heldout.view(), hedgehog(8), bad); },
               "step 1: the update made weights non-finite");
}

// FitOptions::objective (how the Python fit's KL objective plugs in): an objective that
// computes the output MSE and its gradients itself gives the built-in fit's bits, so the
// loop, Adam, the floor and the history around it are the one fit's.
TEST(Fit, ObjectiveHookGivesTheBuiltInFitsBits) {
  const Data train = make_data(2, 24, 130), heldout = make_data(1, 24, 140);
  FitOptions o;
  o.steps = 4;
  o.eval_every = 2;
  const FitResult built_in = fit_features(train.view(), heldout.view(), hedgehog(8), o);
  const Tensor target = exact_attention(train.q, train.k, train.v, [] {
    ExactOptions e;
    e.accumulation = Accumulation::f64;
    return e;
  }());
  int calls = 0;
  o.objective = [&](const FeatureMap& map, AttentionGrads& grads) {
    ++calls;
    AttentionContext context;
    Tensor y(target.shape());
    favor_attention(train.q, train.k, train.v, map, y.mutable_view(), {}, &context);
    Tensor dy(target.shape());
    const auto n = static_cast<size_t>(y.numel());
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) {
      const double e = static_cast<double>(y.data()[i]) - target.data()[i];
      sum += e * e;
      dy.data()[i] = static_cast<float>(2.0 * e / static_cast<double>(n));
    }
    grads = favor_attention_backward(train.q, train.k, train.v, dy, map, {}, true, &context);
    return sum / static_cast<double>(n);
  };
  const FitResult hooked = fit_features(train.view(), heldout.view(), hedgehog(8), o);
  EXPECT_EQ(calls, o.steps + 1);
  EXPECT_EQ(hooked.map.weights, built_in.map.weights);
  EXPECT_EQ(hooked.map.bias, built_in.map.bias);
  EXPECT_EQ(hooked.map.lambda, built_in.map.lambda);
  ASSERT_EQ(hooked.history.size(), built_in.history.size());
  for (size_t i = 0; i < hooked.history.size(); ++i) {
    EXPECT_EQ(hooked.history[i].loss, built_in.history[i].loss) << i;
    EXPECT_EQ(hooked.history[i].heldout_error, built_in.history[i].heldout_error) << i;
  }
  // An objective that gives the wrong number of gradients is named with its step.
  o.objective = [](const FeatureMap&, AttentionGrads& grads) {
    grads.dw.assign(3, 0.0f);
    return 1.0;
  };
  expect_error([&] { fit_features(train.view(), heldout.view(), hedgehog(8), o); },
               "step 0: the objective gave 3 gradients for weights");
}

// The rules the callers share: the lambda floor (sign kept, in float) and the holdout count
// (half away from zero, at least 1, at most n - 1).
TEST(Fit, LambdaFloorAndHeldoutCount) {
  std::vector<float> lambda = {1e-5f, -1e-5f, 0.0f, -0.5f, 2e-3f};
  floor_lambda(lambda.data(), lambda.size(), 1e-3);
  EXPECT_EQ(lambda, (std::vector<float>{1e-3f, -1e-3f, 1e-3f, -0.5f, 2e-3f}));
  EXPECT_EQ(heldout_count(0.25, 10), 3);  // 2.5 rounds away from zero
  EXPECT_EQ(heldout_count(0.25, 2), 1);
  EXPECT_EQ(heldout_count(0.01, 4), 1);
  EXPECT_EQ(heldout_count(0.99, 4), 3);
  expect_error([] { heldout_count(1.0, 4, "--holdout"); }, "--holdout: 1 must lie in (0, 1)");
  expect_error([] { heldout_count(0.5, 1); }, "holdout: 0.5 of 1 leaves none to train on");
}

}  // namespace
}  // namespace favor
