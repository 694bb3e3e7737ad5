// Hybrid attention (AttentionOptions::window, ::sinks: exact softmax on the window and the
// sinks, the estimator on the other keys, one normaliser) against the double reference, which
// materialises A_ij = exp(s_ij) on the exact set and phi(q_i).phi(k_j) gamma^(i - j - w)
// elsewhere; its gradients against central differences of that reference; window >= N
// against exact softmax; window = sinks = 0 against the plain method bit for bit; the
// argument checks. Rerun with
//   ./favor_tests --gtest_filter='Hybrid*'
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "favor/causal_context.hpp"
#include "gradient_check.hpp"
#include "map_fixture.hpp"
#include "test_helpers.hpp"

namespace favor::test_hybrid {
namespace {
using testing::expect_error;
using testing::MapSpec;
using testing::random_map;
using testing::random_tensor;

enum class Mask { none, periodic, left_padded };

struct Case {
  Kernel kernel;
  bool causal;
  int64_t window, sinks;
  Mask mask;
  bool learned = false, decay = false;
};

std::string name_of(const Case& c) {
  return to_string(c.kernel) + (c.causal ? "_causal" : "_bidir") + "_w" + std::to_string(c.window) +
         "_s" + std::to_string(c.sinks) +
         (c.mask == Mask::none       ? ""
          : c.mask == Mask::periodic ? "_periodic"
                                     : "_leftpad") +
         (c.learned ? "_learned" : "") + (c.decay ? "_decay" : "");
}

// Flags [B, N]: every third key out, or batch row 1 left-padded by 5 keys (its sinks move).
std::vector<uint8_t> mask_flags(Mask mask, int64_t B, int64_t N) {
  if (mask == Mask::periodic) return testing::periodic_mask(static_cast<size_t>(B * N), 3, 1);
  std::vector<uint8_t> flags(static_cast<size_t>(B * N), 1);
  if (mask == Mask::left_padded)
    for (int64_t j = 0; j < 5; ++j) flags[static_cast<size_t>(N + j)] = 0;
  return flags;
}

struct Inputs {
  static constexpr int64_t B = 2, H = 2, N = 37, D = 8, Dv = 5, m = 32;
  Tensor q = random_tensor({B, H, N, D}, 1, 1.0);
  Tensor k = random_tensor({B, H, N, D}, 2, 1.0);
  Tensor v = random_tensor({B, H, N, Dv}, 3);
  std::vector<uint8_t> flags;
  FeatureMap map;
  AttentionOptions o;
  explicit Inputs(const Case& c)
      : flags(mask_flags(c.mask, B, N)),
        map(random_map(c.kernel,
                       Projection::draw(m, D, {ProjectionKind::orthogonal, NormMode::chi, 7}),
                       c.learned ? MapSpec{H, true, true, true} : MapSpec{}, 11)) {
    o.causal = c.causal;
    o.window = c.window;
    o.sinks = c.sinks;
    if (c.mask != Mask::none) o.key_mask = KeyMaskView::contiguous(flags.data(), B, N);
    if (c.decay) o.decay = {0.9, 0.97};
  }
};

class HybridVsReference : public ::testing::TestWithParam<Case> {};

TEST_P(HybridVsReference, WithinTwiceNaiveFloatError) {
  const Case c = GetParam();
  Inputs s(c);
  AttentionStats stats;
  testing::expect_near_reference(s.q, s.k, s.v, s.map, s.o, name_of(c), &stats);
  // Rows with no visible key (causal: none up to i) are zeros; every other row has one.
  int64_t blind = 0;
  for (int64_t b = 0; b < Inputs::B; ++b)
    for (int64_t i = 0; i < Inputs::N; ++i) {
      bool seen = false;
      for (int64_t j = 0; j <= (c.causal ? i : Inputs::N - 1); ++j)
        seen |= s.flags[b * Inputs::N + j] != 0;
      blind += seen ? 0 : Inputs::H;
    }
  EXPECT_EQ(stats.zero_rows, blind);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  const std::pair<int64_t, int64_t> shapes[] = {{4, 2}, {0, 3}, {6, 0}, {1, 1}, {16, 4}};
  for (Kernel kernel : {Kernel::positive, Kernel::hyperbolic, Kernel::trig})
    for (bool causal : {false, true})
      for (auto [w, s] : shapes)
        for (Mask mask : {Mask::none, Mask::periodic, Mask::left_padded})
          out.push_back({kernel, causal, w, s, mask});
  // Learned maps (W, b, lambda per head), hedgehog, decay from the window's edge.
  for (bool causal : {false, true}) {
    out.push_back({Kernel::hedgehog, causal, 4, 2, Mask::left_padded, true});
    out.push_back({Kernel::positive, causal, 5, 1, Mask::periodic, true, causal});
  }
  out.push_back({Kernel::positive, true, 3, 2, Mask::none, false, true});
  out.push_back({Kernel::trig, true, 0, 2, Mask::left_padded, false, true});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Kernels, HybridVsReference, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return name_of(info.param); });

// The gradients of q, k, v and of the map's parameters and the decay against central
// differences of the double reference's loss <dy, y> (steps 1e-5, fd_error_float).
class HybridGradients : public ::testing::TestWithParam<Case> {};

// Also from the context the forward saves (AttentionOptions::save_causal_states: the
// estimated parts' chunk states and rows, the merged rows; bidirectional both parts), which
// the backward reads instead of recomputing the forward (causal: the same bits).
TEST_P(HybridGradients, MatchFiniteDifferencesOfTheReference) {
  const Case c = GetParam();
  Inputs s(c);
  const Tensor dy = random_tensor({Inputs::B, Inputs::H, Inputs::N, Inputs::Dv}, 4);
  auto loss = [&] {
    return testing::output_loss(dy, reference::favor_attention(s.q, s.k, s.v, s.map, s.o).values);
  };
  auto as_double = [](const auto& values) {
    return std::vector<double>(values.begin(), values.end());
  };
  // float32 gradients of O(1) sums carry ~1e-6 relative rounding; 1e-4 leaves room for the
  // stabiliser's rounding and catches any wrong term (O(1e-2) and more).
  constexpr double kBound = 1e-4;
  auto check = [&](const AttentionGrads& g, const std::string& how) {
    EXPECT_LE(testing::fd_error_float(s.q.values(), as_double(g.dq.values()), loss), kBound)
        << how << " dq";
    EXPECT_LE(testing::fd_error_float(s.k.values(), as_double(g.dk.values()), loss), kBound)
        << how << " dk";
    EXPECT_LE(testing::fd_error_float(s.v.values(), as_double(g.dv.values()), loss), kBound)
        << how << " dv";
    // dv exactly: the loss is linear in v, so a step of 1 in float64 gives dL/dv to float64
    // rounding; float32 sums of N + F terms are within (N + F + 2) 2^-24 of it (6e-6 at F =
    // 64; measured 1.05e-7 in the learned-decay case, where an option left stepped by the
    // decay's differences gave 2e-5, inside kBound).
    {
      std::vector<double> exact, got;
      const double base = loss();
      for (size_t i = 0; i < s.v.values().size(); i += 5 * testing::kFdStride) {  // 148 of 740
        const float keep = s.v.values()[i];
        s.v.values()[i] = keep + 1.0f;
        exact.push_back(loss() - base);
        s.v.values()[i] = keep;
        got.push_back(g.dv.values()[i]);
      }
      const double rounding = double(Inputs::N + s.map.features() + 2) * std::ldexp(1.0, -24);
      EXPECT_LE(testing::gradient_error(got, exact), rounding) << how << " dv, exactly";
    }
    if (c.learned) {
      EXPECT_LE(testing::fd_error_float(s.map.weights, as_double(g.dw), loss), kBound)
          << how << " dW";
      EXPECT_LE(testing::fd_error_float(s.map.bias, as_double(g.dbias), loss), kBound)
          << how << " db";
      EXPECT_LE(testing::fd_error_float(s.map.lambda, as_double(g.dlambda), loss), kBound)
          << how << " dl";
    }
    if (c.decay) {
      const std::vector<double> decay = s.o.decay;
      std::vector<float> gamma(decay.begin(), decay.end());
      auto decay_loss = [&] {
        s.o.decay.assign(gamma.begin(), gamma.end());
        return loss();
      };
      EXPECT_LE(testing::fd_error_float(gamma, g.ddecay, decay_loss), kBound) << how << " dgamma";
      s.o.decay = decay;  // the loss's last call left the last gamma stepped down, in float
    }
  };
  const AttentionGrads recomputed = favor_attention_backward(s.q, s.k, s.v, dy, s.map, s.o, true);
  check(recomputed, "recomputed");
  AttentionOptions saving = s.o;
  saving.save_causal_states = true;
  AttentionContext context;
  favor_attention(s.q, s.k, s.v, s.map,
                  Tensor({Inputs::B, Inputs::H, Inputs::N, Inputs::Dv}).mutable_view(), saving,
                  &context);
  ASSERT_TRUE(context.valid());
  const AttentionGrads from_context =
      favor_attention_backward(s.q, s.k, s.v, dy, s.map, saving, true, &context);
  check(from_context, "saved");
  // Causal: the same sweeps either way (the recomputing backward saves a context of its
  // own; with a decay and parameter gradients both recompute their sweeps, docs/gradients.md),
  // so the same bits. Bidirectional, the recomputing backward reruns each part's sweep: the
  // same to float32 rounding.
  if (!c.causal) {
    // (float32 rounding of sums of ~N terms: ~1e-6 relative; a wrong term is O(1e-2))
    for (const auto& [a, b] :
         {std::pair{&from_context.dq, &recomputed.dq}, std::pair{&from_context.dk, &recomputed.dk},
          std::pair{&from_context.dv, &recomputed.dv}})
      EXPECT_LE(testing::rel_error(*a, as_double(b->values())), 1e-5);
    return;
  }
  EXPECT_EQ(from_context.dq.values(), recomputed.dq.values());
  EXPECT_EQ(from_context.dk.values(), recomputed.dk.values());
  EXPECT_EQ(from_context.dv.values(), recomputed.dv.values());
}

std::vector<Case> gradient_cases() {
  return {{Kernel::positive, true, 4, 2, Mask::left_padded},
          {Kernel::positive, false, 4, 2, Mask::periodic},
          {Kernel::positive, false, 0, 3, Mask::none},
          {Kernel::hyperbolic, true, 6, 0, Mask::none},
          {Kernel::trig, false, 3, 1, Mask::left_padded},
          {Kernel::positive, true, 5, 1, Mask::periodic, true, true},
          {Kernel::hedgehog, false, 4, 2, Mask::none, true},
          {Kernel::hedgehog, true, 3, 2, Mask::periodic, true},
          {Kernel::trig, true, 0, 2, Mask::left_padded}};
}

INSTANTIATE_TEST_SUITE_P(Kernels, HybridGradients, ::testing::ValuesIn(gradient_cases()),
                         [](const auto& info) { return name_of(info.param); });

// Longer sequences of one head: the causal sweep splits the head over the threads (its
// chunks hand their rows to the exact part as they come, cpu/hybrid_causal.cpp), the band's
// tiles cover the window from both sides of a chunk; inputs and output strided (transposed
// layout), then contiguous; the same rows either way.
TEST(Hybrid, LongOneHeadStridedMatchesTheReference) {
  const int64_t B = 1, H = 1, N = 520, D = 16, Dv = 8;
  const Tensor q = random_tensor({B, H, N, D}, 21, 1.0), k = random_tensor({B, H, N, D}, 22, 1.0),
               v = random_tensor({B, H, N, Dv}, 23);
  std::vector<uint8_t> flags = testing::periodic_mask(static_cast<size_t>(N), 5, 2);
  for (bool causal : {true, false})
    for (bool masked : {false, true}) {
      const std::string label =
          std::string(causal ? "causal" : "bidir") + (masked ? " masked" : "");
      AttentionOptions o;
      o.causal = causal;
      o.window = 40;
      o.sinks = 4;
      if (masked) o.key_mask = KeyMaskView::contiguous(flags.data(), B, N);
      const FeatureMap map = random_map(
          Kernel::positive, Projection::draw(64, D, {ProjectionKind::orthogonal, NormMode::chi, 5}),
          MapSpec{}, 3);
      const Tensor fast = testing::expect_near_reference(q, k, v, map, o, label);
      testing::StridedCopy qs(q), ks(k), vs(v);
      Tensor out_storage({B, N, H, Dv});
      const MutableTensorView out{out_storage.data(), {B, H, N, Dv}, {N * H * Dv, Dv, H * Dv, 1}};
      favor_attention(qs.view, ks.view, vs.view, map, out, o);
      double worst = 0.0;
      for (int64_t i = 0; i < N; ++i)
        for (int64_t x = 0; x < Dv; ++x)
          worst = std::max(worst, std::abs(double(out_storage.data()[i * Dv + x]) -
                                           double(fast.at(0, 0, i, x))));
      EXPECT_EQ(worst, 0.0) << label << ": strided against contiguous";
    }
}

// What a hybrid forward saves: with an estimated part only (causal or bidirectional), at
// hybrid_context_layout's sizes; the backward refuses an empty context or one of other
// inputs (q too, bidirectional), options or direction (causal or not), naming the argument.
TEST(Hybrid, ContextIsSavedWhereThereIsAPartAndChecked) {
  const Tensor dy = random_tensor({Inputs::B, Inputs::H, Inputs::N, Inputs::Dv}, 4);
  Tensor out({Inputs::B, Inputs::H, Inputs::N, Inputs::Dv});
  const Tensor other_q = random_tensor({Inputs::B, Inputs::H, Inputs::N, Inputs::D}, 9, 1.0);
  for (bool causal : {true, false}) {
    const std::string label = causal ? "causal" : "bidirectional";
    Inputs s(Case{Kernel::positive, causal, 4, 2, Mask::none});
    s.o.save_causal_states = true;
    AttentionContext context;
    favor_attention(s.q, s.k, s.v, s.map, out.mutable_view(), s.o, &context);
    ASSERT_TRUE(context.valid()) << label;
    const HybridContextLayout l = hybrid_context_layout(Inputs::B * Inputs::H, Inputs::N,
                                                        s.map.features(), Inputs::Dv, 4, causal);
    EXPECT_EQ(l.suffix_rows, causal ? 0 : Inputs::N - 4) << label;
    EXPECT_EQ(context.states.size(), static_cast<size_t>(l.states)) << label;
    EXPECT_EQ(context.maxima.size(), static_cast<size_t>(l.maxima)) << label;
    EXPECT_EQ(context.rows.size(), static_cast<size_t>(l.rows)) << label;
    expect_error(
        [&] { favor_attention_backward(other_q, s.k, s.v, dy, s.map, s.o, false, &context); },
        "context: it was saved for other q");
    AttentionOptions wider = s.o;
    wider.window = 5;
    expect_error(
        [&] { favor_attention_backward(s.q, s.k, s.v, dy, s.map, wider, false, &context); },
        "context: it was saved for other q");
    AttentionOptions flipped = s.o;
    flipped.causal = !causal;
    expect_error(
        [&] { favor_attention_backward(s.q, s.k, s.v, dy, s.map, flipped, false, &context); },
        "context: it was saved for other q");
    AttentionOptions covering = s.o;
    covering.window = Inputs::N;  // the window holds every key: no estimated part
    favor_attention(s.q, s.k, s.v, s.map, out.mutable_view(), covering, &context);
    EXPECT_FALSE(context.valid()) << label << ": window >= N";
    expect_error(
        [&] { favor_attention_backward(s.q, s.k, s.v, dy, s.map, covering, false, &context); },
        "context: only a hybrid forward call");
    AttentionOptions unsaved = s.o;
    unsaved.save_causal_states = false;
    favor_attention(s.q, s.k, s.v, s.map, out.mutable_view(), unsaved, &context);
    EXPECT_FALSE(context.valid()) << label << ": without save_causal_states";
  }
}

// A bidirectional context whose parts have different numbers of chunk states (window 0: the
// prefix's view has N = 33 rows, 3 states; the suffix's 32, 2 states): the backward from it
// equals the recomputing one (which keeps no context) to float32 rounding, so each part reads
// its own states, rows and log scales.
TEST(Hybrid, BidirectionalContextPartsOfUnequalChunks) {
  const int64_t B = 1, H = 2, N = 33, D = 8, Dv = 5;
  const Tensor q = random_tensor({B, H, N, D}, 31, 1.0), k = random_tensor({B, H, N, D}, 32, 1.0),
               v = random_tensor({B, H, N, Dv}, 33), dy = random_tensor({B, H, N, Dv}, 34);
  const FeatureMap map = random_map(
      Kernel::positive, Projection::draw(32, D, {ProjectionKind::orthogonal, NormMode::chi, 7}),
      MapSpec{}, 11);
  AttentionOptions o;
  o.causal = false;
  o.sinks = 2;
  o.save_causal_states = true;
  const HybridContextLayout l = hybrid_context_layout(B * H, N, map.features(), Dv, 0, false);
  EXPECT_EQ(l.slots, 3);
  EXPECT_EQ(l.suffix_slots, 2);
  AttentionContext context;
  Tensor out({B, H, N, Dv});
  favor_attention(q, k, v, map, out.mutable_view(), o, &context);
  ASSERT_TRUE(context.valid());
  EXPECT_EQ(context.states.size(), static_cast<size_t>(l.states));
  const AttentionGrads saved = favor_attention_backward(q, k, v, dy, map, o, false, &context);
  const AttentionGrads recomputed = favor_attention_backward(q, k, v, dy, map, o, false);
  for (const auto& [a, b] :
       {std::pair{&saved.dq, &recomputed.dq}, std::pair{&saved.dk, &recomputed.dk},
        std::pair{&saved.dv, &recomputed.dv}}) {
    const std::vector<float>& r = b->values();
    EXPECT_LE(testing::rel_error(*a, std::vector<double>(r.begin(), r.end())), 1e-5);
  }
}

// exact_attention with ExactOptions::window, ::sinks: softmax over each query's window and
// sinks alone (the hybrid's exact part, no estimator), against a float64 softmax over that
// set written out here; its gradients against central differences of it (left padding, a
// window and sinks: 4 of the cases).
TEST(Hybrid, ExactOverTheWindowAloneIsSoftmaxOverItsKeys) {
  const std::pair<int64_t, int64_t> shapes[] = {{4, 2}, {0, 3}, {6, 0}, {40, 1}};
  for (bool causal : {true, false})
    for (const auto& shape : shapes)  // (named: clang 14's lambdas take no structured binding)
      for (Mask mask : {Mask::none, Mask::periodic, Mask::left_padded}) {
        const int64_t w = shape.first, sinks = shape.second;
        const Case c{Kernel::positive, causal, w, sinks, mask};
        Inputs s(c);
        ExactOptions o;
        o.causal = causal;
        o.window = w;
        o.sinks = sinks;
        o.key_mask = s.o.key_mask;
        const int64_t B = Inputs::B, H = Inputs::H, N = Inputs::N, D = Inputs::D, Dv = Inputs::Dv;
        const double scale = 1.0 / std::sqrt(double(D));
        // the oracle: keys of row i are its window and the batch row's first `sinks` kept keys
        auto oracle = [&](const Tensor& q, const Tensor& k, const Tensor& v) {
          std::vector<double> y(static_cast<size_t>(B * H * N * Dv), 0.0);
          for (int64_t b = 0; b < B; ++b) {
            std::vector<int64_t> first;
            for (int64_t j = 0; j < N && int64_t(first.size()) < sinks; ++j)
              if (s.flags[b * N + j]) first.push_back(j);
            for (int64_t h = 0; h < H; ++h)
              for (int64_t i = 0; i < N; ++i) {
                std::vector<std::pair<int64_t, double>> keys;
                for (int64_t j = 0; j < N; ++j) {
                  const bool in_window = i - j < w && (causal ? j <= i : j - i < w);
                  const bool sink = std::find(first.begin(), first.end(), j) != first.end() &&
                                    (!causal || j <= i);
                  if (!s.flags[b * N + j] || !(in_window || sink)) continue;
                  double dot = 0.0;
                  for (int64_t x = 0; x < D; ++x)
                    dot += double(q.at(b, h, i, x)) * k.at(b, h, j, x);
                  keys.emplace_back(j, scale * dot);
                }
                if (keys.empty()) continue;
                double top = -INFINITY, den = 0.0;
                for (auto& kv : keys) top = std::max(top, kv.second);
                for (auto& kv : keys) den += std::exp(kv.second - top);
                for (auto& kv : keys)
                  for (int64_t x = 0; x < Dv; ++x)
                    y[((b * H + h) * N + i) * Dv + x] +=
                        std::exp(kv.second - top) / den * v.at(b, h, kv.first, x);
              }
          }
          return y;
        };
        const std::string label = name_of(c);
        const Tensor fast = exact_attention(s.q, s.k, s.v, o);
        EXPECT_LE(testing::rel_error(fast, oracle(s.q, s.k, s.v)), 1e-6) << label;
        // the gradients (the band backward, which the hybrid's FD test also covers) on the
        // left-padded cases with both parts of the exact set
        if (mask != Mask::left_padded || sinks == 0 || w == 0) continue;
        const Tensor dy = random_tensor({B, H, N, Dv}, 4);
        const AttentionGrads g = exact_attention_backward(s.q, s.k, s.v, dy, o);
        auto loss = [&] { return testing::output_loss(dy, oracle(s.q, s.k, s.v)); };
        auto as_double = [](const auto& values) {
          return std::vector<double>(values.begin(), values.end());
        };
        EXPECT_LE(testing::fd_error_float(s.q.values(), as_double(g.dq.values()), loss), 1e-4)
            << label << " dq";
        EXPECT_LE(testing::fd_error_float(s.k.values(), as_double(g.dk.values()), loss), 1e-4)
            << label << " dk";
        EXPECT_LE(testing::fd_error_float(s.v.values(), as_double(g.dv.values()), loss), 1e-4)
            << label << " dv";
      }
  ExactOptions bad;
  bad.window = 4;
  bad.accumulation = Accumulation::f64;
  const Tensor x = random_tensor({1, 1, 5, 4}, 1);
  expect_error([&] { exact_attention(x, x, x, bad); }, "accumulation: f64 is not available");
  bad.accumulation = Accumulation::f32;
  bad.window = -1;
  expect_error([&] { exact_attention(x, x, x, bad); }, "window: -1 must be >= 0");
  bad.window = 2;
  const Tensor longer = random_tensor({1, 1, 6, 4}, 2);
  expect_error([&] { exact_attention(x, longer, longer, bad); }, "Nq == Nk");
}

// A windowed exact call's saved context (ExactContext: lse and a fingerprint): the backward
// from it and the forward's output gives the recomputing backward's gradients bit for bit
// (the same band backward on the same y and lse), on a strided output and dy too; a context of
// other inputs, an output of another shape, an unwindowed call and a context for them are refused.
TEST(Hybrid, WindowBackwardFromTheSavedContextIsTheRecomputingOne) {
  for (bool causal : {true, false}) {
    Inputs s(Case{Kernel::positive, causal, 4, 2, Mask::left_padded});
    ExactOptions o;
    o.causal = causal;
    o.window = 4;
    o.sinks = 2;
    o.key_mask = s.o.key_mask;
    const int64_t B = Inputs::B, H = Inputs::H, N = Inputs::N, Dv = Inputs::Dv;
    // the output written [B, N, H, Dv] (strided as [B, H, N, Dv], as torch's transposes are)
    std::vector<float> storage(static_cast<size_t>(B * N * H * Dv));
    const MutableTensorView out{storage.data(), {B, H, N, Dv}, {N * H * Dv, Dv, H * Dv, 1}};
    ExactContext context;
    exact_attention(s.q, s.k, s.v, out, o, &context);
    ASSERT_TRUE(context.valid());
    EXPECT_EQ(context.lse.size(), static_cast<size_t>(B * H * N));
    const Tensor dy = random_tensor({B, H, N, Dv}, 4);
    const AttentionGrads recomputed = exact_attention_backward(s.q, s.k, s.v, dy, o);
    const AttentionGrads saved = exact_attention_backward(s.q, s.k, s.v, dy, out, context, o);
    EXPECT_EQ(saved.dq.values(), recomputed.dq.values()) << causal;
    EXPECT_EQ(saved.dk.values(), recomputed.dk.values()) << causal;
    EXPECT_EQ(saved.dv.values(), recomputed.dv.values()) << causal;
    // dy read in place at a row stride (torch's transposed layout) and gathered where its
    // features are strided (every other float; a broadcast dy has stride 0): the same bits
    const testing::StridedCopy dy_rows(dy);
    std::vector<float> spaced(static_cast<size_t>(2 * dy.numel()), NAN);
    for (int64_t i = 0; i < dy.numel(); ++i) spaced[static_cast<size_t>(2 * i)] = dy.data()[i];
    const TensorView dy_spaced{spaced.data(), dy.shape(), {2 * H * N * Dv, 2 * N * Dv, 2 * Dv, 2}};
    // a broadcast dy (every row the same Dv values: row stride 0) against its copy
    const std::vector<float> row = {0.5f, -1.25f, 2.0f, 0.125f, -0.75f};
    ASSERT_EQ(static_cast<int64_t>(row.size()), Dv);
    const TensorView dy_broadcast{row.data(), dy.shape(), {0, 0, 0, 1}};
    Tensor dy_copy(dy.shape());
    for (int64_t i = 0; i < dy_copy.numel(); ++i) dy_copy.data()[i] = row[size_t(i % Dv)];
    const AttentionGrads copied = exact_attention_backward(s.q, s.k, s.v, dy_copy, out, context, o);
    const AttentionGrads broadcast =
        exact_attention_backward(s.q, s.k, s.v, dy_broadcast, out, context, o);
    EXPECT_EQ(broadcast.dq.values(), copied.dq.values()) << causal << " broadcast dy";
    EXPECT_EQ(broadcast.dk.values(), copied.dk.values()) << causal << " broadcast dy";
    EXPECT_EQ(broadcast.dv.values(), copied.dv.values()) << causal << " broadcast dy";
    for (const TensorView& g : {dy_rows.view, dy_spaced}) {
      const AttentionGrads from = exact_attention_backward(s.q, s.k, s.v, g, out, context, o);
      EXPECT_EQ(from.dq.values(), saved.dq.values()) << causal << " strided dy";
      EXPECT_EQ(from.dk.values(), saved.dk.values()) << causal << " strided dy";
      EXPECT_EQ(from.dv.values(), saved.dv.values()) << causal << " strided dy";
    }

    // the fingerprint is of the values whatever the layout: q at a row stride (hashed row by
    // row) against the context saved from contiguous q (hashed in blocks of rows)
    const testing::StridedCopy q_rows(s.q);
    const AttentionGrads strided_q =
        exact_attention_backward(q_rows.view, s.k, s.v, dy, out, context, o);
    EXPECT_EQ(strided_q.dq.values(), saved.dq.values()) << causal << " strided q";
    // q, k and v are scanned only when the context is refused: a NaN written into q after
    // the forward is still named as such, and a NaN in dy too
    Tensor nan_q = s.q;
    nan_q.values()[9] = NAN;
    expect_error([&] { exact_attention_backward(nan_q, s.k, s.v, dy, out, context, o); },
                 "q: element [0,0,");
    // a forward that saves a context scans its inputs in the fingerprint's pass: the same
    // error, naming the first bad element
    Tensor nan_k = s.k;
    nan_k.values()[nan_k.values().size() - 2] = INFINITY;
    ExactContext unused;
    expect_error([&] { exact_attention(s.q, nan_k, s.v, out, o, &unused); }, "k: element [");
    expect_error([&] { exact_attention(s.q, nan_k, s.v, out, o); }, "k: element [");
    Tensor nan_dy = dy;
    nan_dy.values()[3] = NAN;
    expect_error([&] { exact_attention_backward(s.q, s.k, s.v, nan_dy, out, context, o); },
                 "dy: element [0,0,0,3] is nan");

    Tensor other_q = s.q;
    other_q.values()[7] += 0.25f;
    expect_error([&] { exact_attention_backward(other_q, s.k, s.v, dy, out, context, o); },
                 "context: saved by a forward of other inputs or options");
    ExactOptions wider = o;
    wider.window = 5;
    expect_error([&] { exact_attention_backward(s.q, s.k, s.v, dy, out, context, wider); },
                 "context: saved by a forward of other inputs or options");
    const Tensor short_y = random_tensor({B, H, N - 1, Dv}, 5);
    expect_error([&] { exact_attention_backward(s.q, s.k, s.v, dy, short_y, context, o); },
                 "y: shape");
    ExactOptions plain;
    plain.causal = causal;
    ExactContext none;
    const Tensor y = random_tensor({B, H, N, Dv}, 6);
    exact_attention(s.q, s.k, s.v, Tensor({B, H, N, Dv}).mutable_view(), plain, &none);
    EXPECT_FALSE(none.valid()) << "an unwindowed call saves nothing";
    expect_error([&] { exact_attention_backward(s.q, s.k, s.v, dy, y, context, plain); },
                 "context: only a windowed exact call");
  }
}

// A windowed call's context is of the values whatever their layout: saved from contiguous
// inputs (each slice hashed in blocks of rows, several at this length) and taken back by a
// backward on copies at a row stride (hashed row by row), and the other way round; a single
// changed bit of k is refused.
TEST(Hybrid, WindowContextIsOfTheValuesWhateverTheLayout) {
  const int64_t B = 1, H = 2, N = 600, D = 16, Dv = 16;
  const Tensor q = random_tensor({B, H, N, D}, 31, 1.0), k = random_tensor({B, H, N, D}, 32, 1.0),
               v = random_tensor({B, H, N, Dv}, 33), dy = random_tensor({B, H, N, Dv}, 34);
  const testing::StridedCopy qs(q), ks(k), vs(v);
  ExactOptions o;
  o.causal = true;
  o.window = 24;
  o.sinks = 2;
  Tensor y({B, H, N, Dv}), ys({B, H, N, Dv});
  ExactContext contiguous, strided;
  exact_attention(q, k, v, y.mutable_view(), o, &contiguous);
  exact_attention(qs.view, ks.view, vs.view, ys.mutable_view(), o, &strided);
  ASSERT_EQ(y.values(), ys.values());
  EXPECT_EQ(contiguous.fingerprint, strided.fingerprint);
  const AttentionGrads a =
      exact_attention_backward(qs.view, ks.view, vs.view, dy, y, contiguous, o);
  const AttentionGrads b = exact_attention_backward(q, k, v, dy, ys, strided, o);
  EXPECT_EQ(a.dk.values(), b.dk.values());
  Tensor flipped = k;
  uint32_t bits;
  std::memcpy(&bits, &flipped.values()[N * D + 5], sizeof bits);
  bits ^= 1u;
  std::memcpy(&flipped.values()[N * D + 5], &bits, sizeof bits);
  expect_error([&] { exact_attention_backward(q, flipped, v, dy, y, contiguous, o); },
               "context: saved by a forward of other inputs or options");
}

// Calls from the threads of the caller's own OpenMP team (a small call runs on the calling
// thread, whose omp_get_thread_num() is then the caller's): each gives the serial result.
TEST(Hybrid, CallsFromTheCallersOpenMPThreadsAgree) {
  Inputs s(Case{Kernel::positive, true, 4, 2, Mask::left_padded});
  const Tensor serial = favor_attention(s.q, s.k, s.v, s.map, s.o);
  constexpr int kCallers = 6;
  std::vector<Tensor> outs;
  for (int t = 0; t < kCallers; ++t)
    outs.emplace_back(Shape4{Inputs::B, Inputs::H, Inputs::N, Inputs::Dv});
#pragma omp parallel for num_threads(kCallers) schedule(static, 1)
  for (int t = 0; t < kCallers; ++t)
    favor_attention(s.q, s.k, s.v, s.map, outs[t].mutable_view(), s.o);
  for (int t = 0; t < kCallers; ++t)
    EXPECT_EQ(outs[t].values(), serial.values()) << "caller thread " << t;
}

TEST(Hybrid, WindowCoveringTheSequenceIsExactSoftmax) {
  for (bool causal : {false, true}) {
    Inputs s({Kernel::positive, causal, Inputs::N, 0, Mask::left_padded});
    const Tensor y = favor_attention(s.q, s.k, s.v, s.map, s.o);
    ExactOptions e;
    e.causal = causal;
    e.key_mask = s.o.key_mask;
    const auto ref = reference::exact_attention(s.q, s.k, s.v, e);
    EXPECT_LE(testing::rel_error(y, ref.values), 1e-6) << causal;
  }
}

TEST(Hybrid, NoWindowNoSinksIsThePlainMethodBitForBit) {
  for (bool causal : {false, true}) {
    Inputs s({Kernel::positive, causal, 0, 0, Mask::periodic});
    AttentionOptions plain = s.o;
    plain.window = plain.sinks = 0;
    const Tensor a = favor_attention(s.q, s.k, s.v, s.map, s.o);
    AttentionOptions defaults;
    defaults.causal = causal;
    defaults.key_mask = s.o.key_mask;
    const Tensor b = favor_attention(s.q, s.k, s.v, s.map, defaults);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), sizeof(float) * size_t(a.numel())), 0);
  }
}

TEST(Hybrid, RowsWithNoVisibleKeyAreZeros) {
  Inputs s({Kernel::positive, true, 4, 2, Mask::none});
  for (int64_t j = 0; j < Inputs::N; ++j) s.flags[static_cast<size_t>(j)] = 0;  // batch row 0
  s.o.key_mask = KeyMaskView::contiguous(s.flags.data(), Inputs::B, Inputs::N);
  AttentionStats stats;
  const Tensor y = favor_attention(s.q, s.k, s.v, s.map, s.o, &stats);
  EXPECT_EQ(stats.zero_rows, Inputs::H * Inputs::N);
  for (int64_t i = 0; i < Inputs::H * Inputs::N * Inputs::Dv; ++i) EXPECT_EQ(y.data()[i], 0.0f);
  const Tensor dy = random_tensor({Inputs::B, Inputs::H, Inputs::N, Inputs::Dv}, 4);
  const AttentionGrads g = favor_attention_backward(s.q, s.k, s.v, dy, s.map, s.o);
  for (float x : g.dq.values()) EXPECT_TRUE(std::isfinite(x));
}

TEST(Hybrid, Errors) {
  Inputs s({Kernel::positive, true, 4, 2, Mask::none});
  AttentionOptions o = s.o;
  o.window = -1;
  expect_error([&] { favor_attention(s.q, s.k, s.v, s.map, o); }, "window: -1 must be >= 0");
  o.window = 4;
  o.sinks = -2;
  expect_error([&] { favor_attention(s.q, s.k, s.v, s.map, o); }, "sinks: -2 must be >= 0");
  o.sinks = 1;
  o.causal = false;
  const Tensor k2 = random_tensor({Inputs::B, Inputs::H, 9, Inputs::D}, 5);
  const Tensor v2 = random_tensor({Inputs::B, Inputs::H, 9, Inputs::Dv}, 6);
  expect_error([&] { favor_attention(s.q, k2, v2, s.map, o); }, "Nq == Nk");
  const Tensor dy = random_tensor({Inputs::B, Inputs::H, Inputs::N, Inputs::Dv}, 4);
  o.window = -3;
  expect_error([&] { favor_attention_backward(s.q, s.k, s.v, dy, s.map, o); }, "window: -3");
}

}  // namespace
}  // namespace favor::test_hybrid

// ---- HybridDecoder ----------------------------------------------------------------------

namespace favor::test_hybrid {
namespace {

// A prompt of `split` tokens through prefill, then one step per token: the rows of causal
// hybrid attention (same map, window, sinks, decay, key mask), and a fixed state size.
void expect_decoding_equals_attention(const Case& c, int64_t split) {
  Inputs s(c);
  const Tensor ref = favor_attention(s.q, s.k, s.v, s.map, s.o);
  DecoderOptions dopt;
  dopt.decay = s.o.decay;
  HybridDecoder dec(Inputs::B, Inputs::H, Inputs::Dv, s.map, c.window, c.sinks, dopt);
  const int64_t bytes = dec.state_bytes();
  const int64_t N = Inputs::N, H = Inputs::H, B = Inputs::B;
  auto slice = [&](const Tensor& t, int64_t from, int64_t n) {
    const Shape4& sh = t.shape();
    return TensorView{t.data() + from * sh[3],
                      {sh[0], sh[1], n, sh[3]},
                      {sh[1] * sh[2] * sh[3], sh[2] * sh[3], sh[3], 1}};
  };
  std::vector<uint8_t> m(static_cast<size_t>(B));
  auto mask_of = [&](int64_t from, int64_t n, std::vector<uint8_t>& buf) {
    buf.resize(static_cast<size_t>(B * n));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < n; ++t) buf[b * n + t] = s.flags[b * N + from + t];
    return KeyMaskView::contiguous(buf.data(), B, n);
  };
  double worst = 0.0;
  auto compare = [&](const Tensor& y, int64_t from, int64_t n) {
    for (int64_t bh = 0; bh < B * H; ++bh)
      for (int64_t t = 0; t < n; ++t)
        for (int64_t x = 0; x < Inputs::Dv; ++x)
          worst =
              std::max(worst, double(std::abs(y.data()[(bh * n + t) * Inputs::Dv + x] -
                                              ref.data()[(bh * N + from + t) * Inputs::Dv + x])));
  };
  std::vector<uint8_t> buf;
  if (split > 0)
    compare(dec.prefill(slice(s.q, 0, split), slice(s.k, 0, split), slice(s.v, 0, split),
                        mask_of(0, split, buf)),
            0, split);
  for (int64_t t = split; t < N; ++t) {
    compare(dec.step(slice(s.q, t, 1), slice(s.k, t, 1), slice(s.v, t, 1), mask_of(t, 1, buf)), t,
            1);
    EXPECT_EQ(dec.state_bytes(), bytes);
  }
  EXPECT_LE(worst, 2e-5) << name_of(c) << " split " << split;
}

TEST(HybridDecoder, DecodingAPromptEqualsTheCausalRows) {
  for (const Case& c : {Case{Kernel::positive, true, 6, 2, Mask::left_padded},
                        Case{Kernel::positive, true, 0, 3, Mask::periodic},
                        Case{Kernel::hyperbolic, true, 5, 0, Mask::none},
                        Case{Kernel::trig, true, 4, 2, Mask::left_padded},
                        Case{Kernel::positive, true, 5, 1, Mask::left_padded, true, true},
                        Case{Kernel::hedgehog, true, 3, 2, Mask::none, true, true},
                        // decay with masked tokens after kept ones: they tick the clock
                        Case{Kernel::positive, true, 5, 1, Mask::periodic, true, true},
                        Case{Kernel::hyperbolic, true, 0, 2, Mask::periodic, false, true}})
    for (int64_t split : {0, 9, 20}) expect_decoding_equals_attention(c, split);
}

TEST(HybridDecoder, SelectStateAndErrors) {
  Inputs s({Kernel::positive, true, 4, 2, Mask::none});
  HybridDecoder dec(Inputs::B, Inputs::H, Inputs::Dv, s.map, 4, 2);
  const Shape4 st{Inputs::H * Inputs::N * Inputs::D, Inputs::N * Inputs::D, Inputs::D, 1};
  const Shape4 sv{Inputs::H * Inputs::N * Inputs::Dv, Inputs::N * Inputs::Dv, Inputs::Dv, 1};
  auto view = [](const Tensor& t, const Shape4& strides, int64_t from, int64_t n) {
    const Shape4& sh = t.shape();
    return TensorView{t.data() + from * sh[3], {sh[0], sh[1], n, sh[3]}, strides};
  };
  dec.prefill(view(s.q, st, 0, 10), view(s.k, st, 0, 10), view(s.v, sv, 0, 10));
  const HybridDecoderState saved = dec.state();
  const Tensor a = dec.step(view(s.q, st, 10, 1), view(s.k, st, 10, 1), view(s.v, sv, 10, 1));
  HybridDecoder fresh(Inputs::B, Inputs::H, Inputs::Dv, s.map, 4, 2);
  fresh.load_state(saved);
  const Tensor b = fresh.step(view(s.q, st, 10, 1), view(s.k, st, 10, 1), view(s.v, sv, 10, 1));
  EXPECT_EQ(std::memcmp(a.data(), b.data(), sizeof(float) * size_t(a.numel())), 0);
  // select: rows 1, 1, 0 equal attention over those rows
  fresh.load_state(saved);
  fresh.select({1, 1, 0});
  EXPECT_EQ(fresh.batch(), 3);
  HybridDecoderState bad = saved;
  bad.ring_k.pop_back();
  expect_error([&] { dec.load_state(bad); }, "state.ring_k");
  expect_error([&] { HybridDecoder(1, 1, 4, s.map, -1, 0); }, "window: -1 must be >= 0");
  expect_error([&] { HybridDecoder(1, 1, 4, s.map, 0, 0); }, "both 0 is the plain method");
}

// A step is append then query in one kernel call: equal up to the projections' rounding
// (one GEMM for the step's rows instead of a matvec per row), the ring and sinks bit for
// bit; the functional form on a state held elsewhere is the owner's call bit for bit.
TEST(HybridDecoder, StepIsAppendThenQueryAndTheViewIsTheOwner) {
  for (const Case& c : {Case{Kernel::positive, true, 4, 2, Mask::left_padded},
                        Case{Kernel::positive, true, 0, 2, Mask::periodic},
                        Case{Kernel::hyperbolic, true, 5, 0, Mask::periodic},
                        Case{Kernel::positive, true, 3, 1, Mask::left_padded, true, true}}) {
    Inputs s(c);
    DecoderOptions dopt;
    dopt.decay = s.o.decay;
    const int64_t B = Inputs::B, H = Inputs::H, N = Inputs::N, split = 7;
    HybridDecoder fused(B, H, Inputs::Dv, s.map, c.window, c.sinks, dopt);
    HybridDecoder split_calls(B, H, Inputs::Dv, s.map, c.window, c.sinks, dopt);
    HybridDecoder lender(B, H, Inputs::Dv, s.map, c.window, c.sinks, dopt);
    auto slice = [&](const Tensor& t, int64_t from, int64_t n) {
      const Shape4& sh = t.shape();
      return TensorView{t.data() + from * sh[3],
                        {sh[0], sh[1], n, sh[3]},
                        {sh[1] * sh[2] * sh[3], sh[2] * sh[3], sh[3], 1}};
    };
    std::vector<uint8_t> m;
    auto mask_of = [&](int64_t from, int64_t n) {
      m.resize(static_cast<size_t>(B * n));
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < n; ++t) m[b * n + t] = s.flags[b * N + from + t];
      return KeyMaskView::contiguous(m.data(), B, n);
    };
    // the state held outside any decoder, as a tensor library holds it
    HybridDecoderState held = lender.state();
    int64_t position = 0;
    const HybridDecoderStateView view{{held.linear.sums.data(), held.linear.log_max.data(),
                                       held.linear.row_positions.data(), nullptr},
                                      &position,
                                      held.ring_k.data(),
                                      held.ring_v.data(),
                                      held.ring_keep.data(),
                                      held.ring_sink.data(),
                                      held.sink_k.data(),
                                      held.sink_v.data(),
                                      held.sink_pos.data()};
    Tensor y0({B, H, split, Inputs::Dv}), y1({B, H, split, Inputs::Dv});
    fused.prefill(slice(s.q, 0, split), slice(s.k, 0, split), slice(s.v, 0, split),
                  y0.mutable_view(), mask_of(0, split));
    split_calls.prefill(slice(s.q, 0, split), slice(s.k, 0, split), slice(s.v, 0, split),
                        mask_of(0, split));
    lender.prefill(view, slice(s.q, 0, split), slice(s.k, 0, split), slice(s.v, 0, split),
                   y1.mutable_view(), mask_of(0, split));
    EXPECT_EQ(std::memcmp(y0.data(), y1.data(), sizeof(float) * size_t(y0.numel())), 0);
    double worst = 0.0;
    for (int64_t t = split; t < N; ++t) {
      const Tensor a =
          fused.step(slice(s.q, t, 1), slice(s.k, t, 1), slice(s.v, t, 1), mask_of(t, 1));
      split_calls.append(slice(s.k, t, 1), slice(s.v, t, 1), mask_of(t, 1));
      const Tensor b = split_calls.query(slice(s.q, t, 1));
      Tensor c2({B, H, 1, Inputs::Dv});
      lender.step(view, slice(s.q, t, 1), slice(s.k, t, 1), slice(s.v, t, 1), c2.mutable_view(),
                  mask_of(t, 1));
      ASSERT_EQ(std::memcmp(a.data(), c2.data(), sizeof(float) * size_t(a.numel())), 0)
          << name_of(c) << " token " << t;
      for (int64_t i = 0; i < a.numel(); ++i)
        worst = std::max(worst, double(std::abs(a.data()[i] - b.data()[i])));
    }
    EXPECT_LE(worst, 1e-5) << name_of(c);
    const HybridDecoderState x = fused.state(), y = split_calls.state();
    EXPECT_EQ(x.ring_k, y.ring_k);
    EXPECT_EQ(x.ring_keep, y.ring_keep);
    EXPECT_EQ(x.ring_sink, y.ring_sink);
    EXPECT_EQ(x.sink_v, y.sink_v);
    EXPECT_EQ(x.sink_pos, y.sink_pos);
    EXPECT_EQ(x.linear.row_positions, y.linear.row_positions);
    EXPECT_EQ(x.linear.position, y.linear.position);
    EXPECT_EQ(position, x.position);
    EXPECT_EQ(held.linear.sums, x.linear.sums);  // the view's state is the owner's, bit for bit
    EXPECT_EQ(held.ring_v, x.ring_v);
    EXPECT_EQ(held.sink_pos, x.sink_pos);
    HybridDecoderState bad = x;
    bad.linear.position += 1;
    expect_error([&] { split_calls.load_state(bad); }, "state.linear.position");
    if (c.window > 0) {
      bad = x;
      bad.ring_sink[0] = 2;
      expect_error([&] { split_calls.load_state(bad); }, "state.ring_sink: 2 must be 0 or 1");
    }
  }
}

}  // namespace
}  // namespace favor::test_hybrid
