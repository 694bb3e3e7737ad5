// Gradients of a feature map's parameters: the learned projections W (per-head sets), the
// biases b, the feature weights lambda and the causal decay gamma. (1) The double reference
// (reference::favor_attention_backward with a FeatureMap) equals central finite differences
// of reference::favor_attention, for every parameter and for q, k, v. (2) The fast float32
// backward (favor_attention_backward with with_parameter_grads) equals the reference within
// twice the error of a naive float32 evaluation of the same gradient (+1e-6), as in
// test_backward.cpp. (3) gamma = 1 changes no bit of dq, dk, dv, dW and still has a ddecay.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <iostream>
#include <string>

#include "gradient_check.hpp"
#include "map_fixture.hpp"
#include "reference/naive.hpp"
#include "reference/naive_grad.hpp"
#include "test_helpers.hpp"

// A namespace of its own: the unity build compiles several test files as one source
// (cmake/FavorUnity.cmake), and their helpers (Case, cases(), ...) share names.
namespace favor::test_map_gradients {
namespace {
using testing::fd_error_float;
using testing::random_tensor;
namespace naive = reference::naive;

// Which parameters a test map has, in how many sets (1, H or B*H; 0: none), and the decay.
struct Spec {
  int64_t sets = 0;
  bool weights = false, bias = false, lambda = false;
  std::vector<double> decay;  // empty, one shared gamma, or one per head
};

std::string spec_name(const Spec& s) {
  std::string out = s.sets == 0 ? "fixed"
                                : std::string(s.weights ? "W" : "") + (s.bias ? "b" : "") +
                                      (s.lambda ? "lambda" : "") + "_sets" + std::to_string(s.sets);
  if (s.decay.size() == 1) out += s.decay[0] == 1.0 ? "_gamma1" : "_decay";
  if (s.decay.size() > 1) out += "_headdecay";
  return out;
}

// The map of `spec` (testing::random_map; sets = 0: the fixed map).
FeatureMap make_map(Kernel kernel, const Projection& w, const Spec& spec, uint64_t seed) {
  return testing::random_map(kernel, w, {spec.sets, spec.weights, spec.bias, spec.lambda}, seed,
                             4242);
}

// ---- (1) the reference against finite differences ----

// || fd - analytic || / || analytic || over the decay values (double), as fd_error_float
// (gradient_check.hpp) over float arrays. gamma lies in (0, 1]: at gamma = 1 the difference is
// one-sided, (3 L(g) - 4 L(g - h) + L(g - 2h)) / 2h, also second order.
double fd_error_decay(std::vector<double>& gamma, const std::vector<double>& analytic,
                      const std::function<double()>& loss) {
  const double step = 1e-5;
  std::vector<double> fd(gamma.size());
  for (size_t i = 0; i < gamma.size(); ++i) {
    const double saved = gamma[i];
    const auto at = [&](double g) {
      gamma[i] = g;
      const double l = loss();
      gamma[i] = saved;
      return l;
    };
    fd[i] = saved + step <= 1.0
                ? (at(saved + step) - at(saved - step)) / (2 * step)
                : (3 * at(saved) - 4 * at(saved - step) + at(saved - 2 * step)) / (2 * step);
  }
  return testing::gradient_error(fd, analytic);
}

struct FdCase {
  Kernel kernel;
  bool causal, masked;
  Spec spec;
};

std::string fd_name(const FdCase& c) {
  return to_string(c.kernel) + (c.causal ? "_causal" : "_bidir") + (c.masked ? "_masked" : "") +
         "_" + spec_name(c.spec);
}

class MapGradientVsFiniteDifferences : public ::testing::TestWithParam<FdCase> {};

TEST_P(MapGradientVsFiniteDifferences, RelativeErrorBelow1e6) {
  const FdCase c = GetParam();
  // B = 2, H = 2 (sets 1, H = 2 and B*H = 4 differ); D = 3 != Dv = 2; N = 7; scale 0.6.
  const int64_t B = 2, H = 2, nk = 7, nq = c.causal ? 7 : 5, D = 3, Dv = 2;
  const int64_t m = c.kernel == Kernel::trig ? 24 : 6;
  Tensor q = random_tensor({B, H, nq, D}, 1, 0.8), k = random_tensor({B, H, nk, D}, 2, 0.8),
         v = random_tensor({B, H, nk, Dv}, 3);
  const Tensor dy = random_tensor({B, H, nq, Dv}, 4);
  FeatureMap map = make_map(
      c.kernel, Projection::draw(m, D, {ProjectionKind::iid, NormMode::chi, 5}), c.spec, 6);
  map.scale = 0.6;
  const std::vector<uint8_t> mask{1, 0, 1, 1, 0, 1, 1, 1, 1, 0, 1, 1, 1, 0};
  AttentionOptions o;
  o.causal = c.causal;
  o.decay = c.spec.decay;
  if (c.masked) o.key_mask = KeyMaskView::contiguous(mask.data(), B, nk);
  const auto loss = [&] {
    return testing::output_loss(dy, reference::favor_attention(q, k, v, map, o).values);
  };
  const auto g = reference::favor_attention_backward(q, k, v, dy, map, o);
  ASSERT_EQ(g.dw.size(), map.weights.empty() ? static_cast<size_t>(m * D) : map.weights.size());
  ASSERT_EQ(g.dbias.size(), map.bias.size());
  ASSERT_EQ(g.dlambda.size(), map.lambda.size());
  ASSERT_EQ(g.ddecay.size(), o.decay.size());
  // Central differences with step 1e-5: truncation ~1e-10 and rounding ~1e-11 relative.
  EXPECT_LE(fd_error_float(q.values(), g.dq.values, loss), 1e-6) << "dq";
  EXPECT_LE(fd_error_float(k.values(), g.dk.values, loss), 1e-6) << "dk";
  EXPECT_LE(fd_error_float(v.values(), g.dv.values, loss), 1e-6) << "dv";
  if (!map.weights.empty()) {
    EXPECT_LE(fd_error_float(map.weights, g.dw, loss), 1e-6) << "dW";
  } else {
    std::vector<float> w = map.projection.matrix();
    const FeatureMap saved = map;
    const auto loss_w = [&] {
      map.projection = Projection::from_matrix(m, D, w);
      return loss();
    };
    EXPECT_LE(fd_error_float(w, g.dw, loss_w), 1e-6) << "dW";
    map = saved;
  }
  if (!map.bias.empty() && c.kernel == Kernel::trig) {
    // phi(q).phi(k) = sum_f lambda_f^2 / m e^(|q'|^2 + |k'|^2)/2 cos(a_f(q) - a_f(k)): a bias
    // added to both cancels, so dL/db = 0 (up to double rounding of O(1) terms).
    double largest = 0;
    for (double x : g.dbias) largest = std::max(largest, std::abs(x));
    EXPECT_LE(largest, 1e-12) << "db (trig: zero)";
  } else if (!map.bias.empty()) {
    EXPECT_LE(fd_error_float(map.bias, g.dbias, loss), 1e-6) << "db";
  }
  if (!map.lambda.empty()) {
    EXPECT_LE(fd_error_float(map.lambda, g.dlambda, loss), 1e-6) << "dlambda";
  }
  if (!o.decay.empty()) EXPECT_LE(fd_error_decay(o.decay, g.ddecay, loss), 1e-6) << "ddecay";
}

std::vector<FdCase> fd_cases() {
  std::vector<FdCase> out;
  for (Kernel kernel : {Kernel::positive, Kernel::trig, Kernel::hyperbolic, Kernel::hedgehog}) {
    for (bool causal : {false, true}) {
      // Every parameter in 1, H and B*H sets; causal: shared, per-head and gamma = 1 decay.
      out.push_back(
          {kernel,
           causal,
           false,
           {1, true, true, true, causal ? std::vector<double>{0.9} : std::vector<double>{}}});
      out.push_back(
          {kernel,
           causal,
           true,
           {2, true, true, true, causal ? std::vector<double>{0.8, 0.95} : std::vector<double>{}}});
      out.push_back(
          {kernel,
           causal,
           false,
           {4, true, true, true, causal ? std::vector<double>{1.0} : std::vector<double>{}}});
      // lambda alone (dW of the shared projection) and the fixed map with decay.
      out.push_back({kernel, causal, true, {2, false, false, true, {}}});
      if (causal) out.push_back({kernel, causal, true, {0, false, false, false, {0.7, 1.0}}});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(All, MapGradientVsFiniteDifferences, ::testing::ValuesIn(fd_cases()),
                         [](const auto& info) { return fd_name(info.param); });

// ---- (2) the fast backward against the reference ----

struct Case {
  int64_t B, H, Nq, Nk, D, Dv, m;
  Kernel kernel;
  bool causal, masked, strided;
  Spec spec;
};

std::string name_of(const Case& c) {
  return to_string(c.kernel) + (c.causal ? "_causal" : "_bidir") + (c.masked ? "_masked" : "") +
         (c.strided ? "_strided" : "") + "_B" + std::to_string(c.B) + "H" + std::to_string(c.H) +
         "_N" + std::to_string(c.Nq) + "x" + std::to_string(c.Nk) + "_m" + std::to_string(c.m) +
         "_" + spec_name(c.spec);
}

class MapBackwardVsReference : public ::testing::TestWithParam<Case> {};

TEST_P(MapBackwardVsReference, WithinTwiceNaiveFloatError) {
  const Case c = GetParam();
  const testing::BackwardInputs in(c.B, c.H, c.Nq, c.Nk, c.D, c.Dv, c.masked);
  const Tensor &q = in.q, &k = in.k, &v = in.v, &dy = in.dy;
  FeatureMap map =
      make_map(c.kernel, Projection::draw(c.m, c.D, {ProjectionKind::orthogonal, NormMode::chi, 7}),
               c.spec, 8);
  if (data_adapted(c.kernel)) map.fit = KernelFit::constant(0.08, c.D);
  AttentionOptions o;
  o.causal = c.causal;
  o.decay = c.spec.decay;
  o.key_mask = in.key_mask();
  const AttentionGrads fast = in.fast_backward(map, o, c.strided);
  const auto ref = reference::favor_attention_backward(q, k, v, dy, map, o);
  const double scale = 1.0 / std::sqrt(double(c.D));
  const auto n32 = naive::map_backward<float>(q, k, v, dy, map, o, scale, map.fit);
  const auto check = [&](const auto& got, const std::vector<float>& naive32,
                         const std::vector<double>& exact, const char* what) {
    ASSERT_EQ(got.size(), exact.size()) << what << " of " << name_of(c);
    const testing::GradientComparison r = testing::expect_within_twice_naive(
        got, naive32, exact, std::string(what) + " of " + name_of(c));
    if (!r.zero && std::string(what) == "ddecay") {
      std::cout << "[ ddecay fast vs reference ] " << name_of(c) << ": relative error " << r.error
                << ", naive float32 " << r.naive_error << "\n";
    }
  };
  check(fast.dq.values(), n32.dq, ref.dq.values, "dq");
  check(fast.dk.values(), n32.dk, ref.dk.values, "dk");
  check(fast.dv.values(), n32.dv, ref.dv.values, "dv");
  check(fast.dw, n32.dw, ref.dw, "dW");
  check(fast.dbias, n32.dbias, ref.dbias, "db");
  check(fast.dlambda, n32.dlambda, ref.dlambda, "dlambda");
  check(fast.ddecay, n32.ddecay, ref.ddecay, "ddecay");
}

std::vector<Case> cases() {
  std::vector<Case> out;
  const std::vector<double> none, shared{0.97}, per_head{0.9, 0.99, 1.0}, one{1.0};
  for (Kernel kernel : {Kernel::positive, Kernel::trig, Kernel::hyperbolic, Kernel::hedgehog}) {
    for (bool causal : {false, true}) {
      const int64_t nk = causal ? 70 : 45;
      // Tails of the causal chunk (32) and the row tile (256); D != Dv; masks; strides.
      // Sets = H with B = 2 (each set sums over the batch), per-head decay.
      out.push_back({2,
                     3,
                     70,
                     nk,
                     12,
                     5,
                     24,
                     kernel,
                     causal,
                     false,
                     false,
                     {3, true, true, true, causal ? per_head : none}});
      // Sets = B*H, masked, strided, shared decay.
      out.push_back({2,
                     2,
                     33,
                     33,
                     8,
                     8,
                     16,
                     kernel,
                     causal,
                     true,
                     true,
                     {4, true, true, true, causal ? shared : none}});
      // One set; two row tiles; gamma = 1 (a ddecay all the same).
      out.push_back({1,
                     1,
                     300,
                     300,
                     6,
                     9,
                     17,
                     kernel,
                     causal,
                     true,
                     false,
                     {1, true, true, true, causal ? one : none}});
      // lambda alone in H sets (dW of the shared projection), bias alone in B*H sets.
      out.push_back(
          {2, 2, 40, 40, 8, 4, 16, kernel, causal, false, false, {2, false, false, true}});
      out.push_back({2, 2, 40, 40, 8, 4, 16, kernel, causal, true, false, {4, false, true, false}});
      // One key.
      out.push_back({1, 1, 1, 1, 4, 3, 8, kernel, causal, false, false, {1, true, true, true}});
    }
    // The fixed map with decay over a long sequence (many chunks).
    out.push_back({1,
                   2,
                   200,
                   200,
                   8,
                   4,
                   16,
                   kernel,
                   true,
                   false,
                   false,
                   {0, false, false, false, {0.95, 0.8}}});
  }
  // Strong decay over long sequences, per head: ddecay is a sum over pairs of (i - j) A_ij dA_ij
  // that cancels only within each query's row. (A position-weighted sum of the keys' dL/dg_j,
  // which cancels across the whole head, failed all of these: its error grows like
  // N (1 - gamma) 2^-24.)
  for (Kernel kernel : {Kernel::positive, Kernel::trig, Kernel::hyperbolic, Kernel::hedgehog}) {
    out.push_back({1,
                   2,
                   2000,
                   2000,
                   8,
                   4,
                   16,
                   kernel,
                   true,
                   false,
                   false,
                   {2, true, true, true, {0.5, 0.6}}});
  }
  const Spec gamma09{2, true, true, true, {0.9, 0.9}};
  out.push_back({1, 2, 200, 200, 16, 8, 64, Kernel::positive, true, false, false, gamma09});
  out.push_back({1, 2, 200, 200, 16, 8, 16, Kernel::trig, true, false, false, gamma09});
  out.push_back({1, 2, 200, 200, 8, 8, 16, Kernel::hedgehog, true, false, false, gamma09});
  // FAVOR++ / FAVOR# with decay: dW through the fit and ddecay.
  for (Kernel kernel : {Kernel::favorpp, Kernel::favorsharp}) {
    out.push_back(
        {2, 2, 70, 70, 8, 5, 16, kernel, true, true, false, {0, false, false, false, {0.9}}});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Kernels, MapBackwardVsReference, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return name_of(info.param); });

// ---- (3) gamma = 1 ----

TEST(MapBackward, GammaOneChangesNoBitAndHasADecayGradient) {
  const Tensor q = random_tensor({2, 2, 80, 8}, 1, 1.0), k = random_tensor({2, 2, 80, 8}, 2, 1.0),
               v = random_tensor({2, 2, 80, 5}, 3), dy = random_tensor({2, 2, 80, 5}, 4);
  for (Kernel kernel : {Kernel::positive, Kernel::trig, Kernel::hyperbolic, Kernel::hedgehog}) {
    const FeatureMap map = make_map(kernel, Projection::draw(16, 8), {2, true, true, true}, 9);
    AttentionOptions o;
    o.causal = true;
    const AttentionGrads plain = favor_attention_backward(q, k, v, dy, map, o, true);
    o.decay = {1.0, 1.0};
    const AttentionGrads decayed = favor_attention_backward(q, k, v, dy, map, o, true);
    EXPECT_EQ(plain.dq.values(), decayed.dq.values()) << to_string(kernel);
    EXPECT_EQ(plain.dk.values(), decayed.dk.values()) << to_string(kernel);
    EXPECT_EQ(plain.dv.values(), decayed.dv.values()) << to_string(kernel);
    EXPECT_EQ(plain.dw, decayed.dw) << to_string(kernel);
    EXPECT_EQ(plain.dbias, decayed.dbias) << to_string(kernel);
    EXPECT_EQ(plain.dlambda, decayed.dlambda) << to_string(kernel);
    EXPECT_TRUE(plain.ddecay.empty());
    ASSERT_EQ(decayed.ddecay.size(), 2u);
    // Without decay L does not depend on gamma, but its derivative at gamma = 1 is generally
    // nonzero: keys further back weigh less as gamma falls.
    EXPECT_NE(decayed.ddecay[0], 0.0) << to_string(kernel);
  }
}

TEST(MapBackward, ParameterGradientsOnlyWhenAsked) {
  const Tensor q = random_tensor({1, 2, 20, 4}, 1), k = random_tensor({1, 2, 20, 4}, 2),
               v = random_tensor({1, 2, 20, 3}, 3), dy = random_tensor({1, 2, 20, 3}, 4);
  const FeatureMap map =
      make_map(Kernel::hedgehog, Projection::draw(8, 4), {2, true, true, true}, 1);
  AttentionOptions o;
  o.causal = true;
  o.decay = {0.9};
  const AttentionGrads without = favor_attention_backward(q, k, v, dy, map, o, false);
  EXPECT_TRUE(without.dw.empty() && without.dbias.empty() && without.dlambda.empty() &&
              without.ddecay.empty());
  const AttentionGrads with = favor_attention_backward(q, k, v, dy, map, o, true);
  EXPECT_EQ(with.dw.size(), 2u * 8 * 4);
  EXPECT_EQ(with.dbias.size(), 2u * 8);
  EXPECT_EQ(with.dlambda.size(), 2u * 8);
  EXPECT_EQ(with.ddecay.size(), 1u);
  EXPECT_EQ(with.dq.values(), without.dq.values());
}

}  // namespace
}  // namespace favor::test_map_gradients
