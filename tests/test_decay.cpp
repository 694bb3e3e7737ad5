// Causal decay gamma^(i - j) (AttentionOptions::decay, DecoderOptions::decay) against the
// double reference, which multiplies the materialised A_ij by gamma_h^(i - j); gamma = 1
// against no decay bit for bit; independence of the thread count (segments of a split head);
// the decoder; and the argument checks. Rerun with
//   ./favor_tests --gtest_filter='Decay*'
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "map_fixture.hpp"
#include "test_helpers.hpp"

// A namespace of its own: the unity build compiles several test files as one source
// (cmake/FavorUnity.cmake), and their helpers (Case, cases(), ...) share names.
namespace favor::test_decay {
namespace {
using testing::expect_error;
using testing::MapSpec;
using testing::random_map;
using testing::random_tensor;

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), static_cast<size_t>(a.numel()) * sizeof(float)) == 0;
}

struct Case {
  Kernel kernel;
  std::vector<double> decay;
  MapSpec spec;
  bool masked;
};

std::string name_of(const Case& c) {
  std::string gammas;
  for (double g : c.decay) gammas += "_" + std::to_string(int(std::lround(g * 100)));
  return to_string(c.kernel) + gammas + "_" + testing::spec_name(c.spec) +
         (c.masked ? "_masked" : "");
}

void PrintTo(const Case& c, std::ostream* os) {
  *os << name_of(c);
}

class DecayVsReference : public ::testing::TestWithParam<Case> {};

TEST_P(DecayVsReference, WithinTwiceNaiveFloatError) {
  const Case c = GetParam();
  const int64_t B = 2, H = 3, N = 150, D = 16, Dv = 8;
  const Tensor q = random_tensor({B, H, N, D}, 1, 1.0), k = random_tensor({B, H, N, D}, 2, 1.0),
               v = random_tensor({B, H, N, Dv}, 3);
  const Projection w = Projection::draw(23, D, {ProjectionKind::orthogonal, NormMode::chi, 7});
  FeatureMap map = random_map(c.kernel, w, c.spec, 13);
  if (data_adapted(c.kernel)) map.fit = KernelFit::constant(-0.1, D);
  std::vector<uint8_t> mask = testing::periodic_mask(static_cast<size_t>(B * N), 4, 2);
  AttentionOptions o;
  o.causal = true;
  o.decay = c.decay;
  if (c.masked) o.key_mask = KeyMaskView::contiguous(mask.data(), B, N);
  AttentionStats stats;
  testing::expect_near_reference(q, k, v, map, o, name_of(c), &stats);
  // Rows before a batch's first visible key see none (batch 1's key 0 is masked).
  int64_t blind = 0;
  for (int64_t b = 0; c.masked && b < B; ++b)
    for (int64_t j = 0; mask[b * N + j] == 0; ++j) blind += H;
  if (c.kernel != Kernel::trig) EXPECT_EQ(stats.zero_rows, blind);
}

std::vector<Case> cases() {
  const std::vector<double> per_head{0.9, 0.5, 0.99}, shared{0.8};
  const MapSpec plain{}, learned{3, true, true, true};
  std::vector<Case> out;
  for (Kernel kernel : {Kernel::positive, Kernel::trig, Kernel::hyperbolic, Kernel::hedgehog}) {
    out.push_back({kernel, per_head, plain, false});
    out.push_back({kernel, shared, plain, true});
    out.push_back({kernel, per_head, learned, true});
  }
  out.push_back({Kernel::favorpp, per_head, plain, true});
  out.push_back({Kernel::favorsharp, shared, plain, false});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Kernels, DecayVsReference, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return name_of(info.param); });

TEST(Decay, StrongDecayOverLongSequenceStaysFiniteAndExact) {
  // gamma = 0.5 over N = 2000: key log weights grow to j log 2 ~ 1386 (exp of it overflows
  // any float); the running max keeps every feature finite and the result is the reference's.
  // One head on 2 threads: the split (segmented) path too.
  testing::ThreadCount restore;
  const int64_t N = 2000, D = 8, Dv = 4;
  const Tensor q = random_tensor({1, 1, N, D}, 4, 1.0), k = random_tensor({1, 1, N, D}, 5, 1.0),
               v = random_tensor({1, 1, N, Dv}, 6);
  const Projection w = Projection::draw(16, D, {ProjectionKind::orthogonal, NormMode::chi, 3});
  AttentionOptions o;
  o.causal = true;
  o.decay = {0.5};
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (Kernel kernel : {Kernel::positive, Kernel::hedgehog}) {
      AttentionStats stats;
      const Tensor y = testing::expect_near_reference(
          q, k, v, FeatureMap(w, kernel), o,
          to_string(kernel) + " threads " + std::to_string(threads), &stats);
      for (float x : y.values()) ASSERT_TRUE(std::isfinite(x));
      EXPECT_EQ(stats.zero_rows, 0);
    }
  }
}

TEST(Decay, GammaOneIsNoDecayBitForBit) {
  // gamma = 1: rate -log 1 = 0 and g + j * 0 = g, so every path gives today's bits: causal
  // with one task per head (B*H = 6 >= threads), a split head (B*H = 1 on 2 threads: segments
  // of the sequence), the decoder token by token and after a prefill.
  testing::ThreadCount restore;
  set_num_threads(2);
  const Projection w = Projection::draw(20, 8, {ProjectionKind::orthogonal, NormMode::chi, 4});
  for (const Shape4& shape : {Shape4{2, 3, 150, 8}, Shape4{1, 1, 700, 8}}) {
    const Shape4 vshape{shape[0], shape[1], shape[2], 5};
    const Tensor q = random_tensor(shape, 7, 1.0), k = random_tensor(shape, 8, 1.0),
                 v = random_tensor(vshape, 9);
    for (Kernel kernel : {Kernel::positive, Kernel::trig, Kernel::hyperbolic, Kernel::hedgehog}) {
      const FeatureMap map = random_map(kernel, w, {1, false, true, true}, 2);
      AttentionOptions none, ones, per_head;
      none.causal = ones.causal = per_head.causal = true;
      ones.decay = {1.0};
      per_head.decay.assign(static_cast<size_t>(shape[1]), 1.0);
      const Tensor base = favor_attention(q, k, v, map, none);
      EXPECT_TRUE(same_bits(favor_attention(q, k, v, map, ones), base)) << to_string(kernel);
      EXPECT_TRUE(same_bits(favor_attention(q, k, v, map, per_head), base)) << to_string(kernel);
      for (const std::vector<int64_t>& groups : {std::vector<int64_t>{}, {64, 1, 7}}) {
        Decoder plain(shape[0], shape[1], 5, map);
        DecoderOptions d1;
        d1.decay = {1.0};
        Decoder unit(shape[0], shape[1], 5, map, d1);
        std::vector<int64_t> rows;
        EXPECT_TRUE(same_bits(testing::decode(plain, q, k, v, groups, &rows),
                              testing::decode(unit, q, k, v, groups, &rows)))
            << to_string(kernel) << " decoder groups " << groups.size();
      }
    }
  }
}

TEST(Decay, ThreadCountDoesNotChangeTheResult) {
  // One head (B*H = 1) split into sequence segments on 2 threads against one sweep on 1
  // thread, with decay. The split changes only the order of the state's sums: the state
  // before a segment is the previous state plus a separately summed local state, rescaled at
  // other running maxima (two rescalings and one add more: a few float32 ulps of each entry),
  // which moves the outputs by the same order. Allowed: 16 ulps, 16 * 2^-24 ~ 1e-6 relative
  // (Frobenius). Each also meets the reference rule. Every seventh key is masked (positions
  // stay absolute). With at least as many heads as threads (B*H = 6) every head is one task
  // swept in one order: the same bits.
  testing::ThreadCount restore;
  const int64_t N = 1500, D = 12, Dv = 6;
  const Tensor q = random_tensor({1, 1, N, D}, 11, 1.0), k = random_tensor({1, 1, N, D}, 12, 1.0),
               v = random_tensor({1, 1, N, Dv}, 13);
  const Tensor q6 = random_tensor({2, 3, 300, D}, 14, 1.0),
               k6 = random_tensor({2, 3, 300, D}, 15, 1.0), v6 = random_tensor({2, 3, 300, Dv}, 16);
  const Projection w = Projection::draw(24, D, {ProjectionKind::orthogonal, NormMode::chi, 5});
  const std::vector<uint8_t> mask = testing::periodic_mask(static_cast<size_t>(N), 7, 3);
  for (Kernel kernel : {Kernel::positive, Kernel::hyperbolic, Kernel::hedgehog, Kernel::trig}) {
    const FeatureMap map = random_map(kernel, w, {1, false, true, true}, 8);
    AttentionOptions o;
    o.causal = true;
    o.decay = {0.995};
    o.key_mask = KeyMaskView::contiguous(mask.data(), 1, N);
    set_num_threads(1);
    const Tensor one = testing::expect_near_reference(q, k, v, map, o, to_string(kernel) + " 1");
    set_num_threads(2);
    const Tensor two = testing::expect_near_reference(q, k, v, map, o, to_string(kernel) + " 2");
    EXPECT_LE(relative_frobenius_error(two, one), 1e-6) << to_string(kernel);
    AttentionOptions o6 = o;
    o6.key_mask.reset();
    set_num_threads(1);
    const Tensor six_one = favor_attention(q6, k6, v6, map, o6);
    set_num_threads(2);
    EXPECT_TRUE(same_bits(favor_attention(q6, k6, v6, map, o6), six_one)) << to_string(kernel);
  }
}

TEST(Decay, DecoderEqualsCausalAttention) {
  // Token by token, and in groups (a prefill of T = 45 tokens, then single tokens and groups
  // of 8 and 20 whose positions continue from the tokens before), the decoder with decay gives
  // the rows of causal attention with the same decay (1e-5 relative, as test_streaming.cpp).
  // Learned maps (W, b, lambda per head), and FAVOR++ with a constant fit.
  const int64_t B = 2, H = 3, N = 130, D = 16, Dv = 8;
  const Tensor q = random_tensor({B, H, N, D}, 31, 1.2), k = random_tensor({B, H, N, D}, 32, 1.2),
               v = random_tensor({B, H, N, Dv}, 33);
  const Projection w = Projection::draw(24, D, {ProjectionKind::orthogonal, NormMode::chi, 6});
  for (Kernel kernel :
       {Kernel::positive, Kernel::trig, Kernel::hyperbolic, Kernel::hedgehog, Kernel::favorpp}) {
    for (const std::vector<double>& decay : {std::vector<double>{0.9, 0.5, 0.99}, {0.95}}) {
      FeatureMap map(w, kernel);
      if (data_adapted(kernel)) {
        map.fit = KernelFit::constant(-0.1, D);
      } else {
        map = random_map(kernel, w, {H, true, true, true}, 17);
      }
      AttentionOptions o;
      o.causal = true;
      o.decay = decay;
      const Tensor batch = testing::expect_near_reference(q, k, v, map, o, to_string(kernel));
      DecoderOptions dopt;
      dopt.decay = decay;
      for (const std::vector<int64_t>& groups : {std::vector<int64_t>{}, {45, 1, 1, 8, 1, 20, 1}}) {
        Decoder dec(B, H, Dv, map, dopt);
        std::vector<int64_t> rows;
        const Tensor streamed = testing::decode(dec, q, k, v, groups, &rows);
        EXPECT_EQ(dec.position(), N);
        EXPECT_LE(testing::rows_rel_error(streamed, batch, rows), 1e-5)
            << to_string(kernel) << " decay values " << decay.size() << " groups " << groups.size();
      }
    }
  }
}

TEST(Decay, ArgumentErrorsNameTheArgument) {
  const int64_t B = 1, H = 3, N = 10, D = 8;
  const Tensor q = random_tensor({B, H, N, D}, 1), k = random_tensor({B, H, N, D}, 2),
               v = random_tensor({B, H, N, 4}, 3), dy = random_tensor({B, H, N, 4}, 4);
  const Projection w = Projection::draw(16, D);
  auto with = [](std::vector<double> decay, bool causal = true) {
    AttentionOptions o;
    o.causal = causal;
    o.decay = std::move(decay);
    return o;
  };
  auto attend = [&](const AttentionOptions& o) {
    return [&q, &k, &v, &w, o] { favor_attention(q, k, v, w, o); };
  };
  expect_error(attend(with({0.9}, false)), "decay: decay gamma^(i - j) is defined for causal");
  expect_error(attend(with({0.9, 0.8})), "decay: has 2 values; give 1 or one per head (3)");
  expect_error(attend(with({0.9, 0.8, 0.7, 0.6})), "decay: has 4 values");
  expect_error(attend(with({0.9, 0.0, 0.7})), "decay[1] = 0");
  expect_error(attend(with({1.5})), "decay[0] = 1.5");
  expect_error(attend(with({-0.5})), "decay[0] = -0.5");
  expect_error(attend(with({double(NAN)})), "decay[0] = nan");
  expect_error(attend(with({0.9, 0.9, double(INFINITY)})), "decay[2]");
  // The FeatureMap overload, the backward pass, the decoder and the reference: same rules.
  expect_error([&] { favor_attention(q, k, v, FeatureMap(w), with({0.9}, false)); }, "decay:");
  expect_error([&] { favor_attention_backward(q, k, v, dy, w, with({2.0})); }, "decay[0] = 2");
  expect_error([&] { reference::favor_attention(q, k, v, w, with({0.9}, false)); }, "decay:");
  expect_error([&] { reference::favor_attention(q, k, v, w, with({0.0})); }, "decay[0] = 0");
  for (const std::vector<double>& bad : {std::vector<double>{0.9, 0.8}, {0.0}, {1.01}}) {
    DecoderOptions o;
    o.decay = bad;
    expect_error([&] { Decoder(B, H, 4, w, o); }, "decay");
  }
}

}  // namespace
}  // namespace favor::test_decay
