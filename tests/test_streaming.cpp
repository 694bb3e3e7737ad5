// The streaming decoder against causal batch attention.
#include <gtest/gtest.h>

#include "test_helpers.hpp"

namespace favor {
namespace {
using testing::random_tensor;
using testing::tokens;

class DecoderVsCausal : public ::testing::TestWithParam<Kernel> {};

TEST_P(DecoderVsCausal, TokenByTokenEqualsCausalBatch) {
  const Kernel kernel = GetParam();
  const int64_t B = 2, H = 3, N = 150, D = 16, Dv = 8;
  const Tensor q = random_tensor({B, H, N, D}, 1, 1.5), k = random_tensor({B, H, N, D}, 2, 1.5),
               v = random_tensor({B, H, N, Dv}, 3);
  const Projection w = Projection::draw(40, D, {ProjectionKind::orthogonal, NormMode::chi, 8});
  AttentionOptions o;
  o.kernel = kernel;
  o.causal = true;
  const Tensor batch = favor_attention(q, k, v, w, o);

  Decoder dec(B, H, Dv, w, {kernel, std::nullopt});
  Tensor streamed({B, H, N, Dv});
  for (int64_t i = 0; i < N; ++i) {
    dec.append(tokens(k, i), tokens(v, i));
    const Tensor y = dec.query(tokens(q, i));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t x = 0; x < Dv; ++x) streamed.at(b, h, i, x) = y.at(b, h, 0, x);
  }
  EXPECT_EQ(dec.position(), N);
  // The bound: 1e-5 relative (Frobenius). Both are float32 evaluations of the same
  // exact formula with different summation orders; each is within ~(N + F) * 2^-24 of it.
  EXPECT_LE(relative_frobenius_error(streamed, batch), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Kernels, DecoderVsCausal,
                         ::testing::Values(Kernel::positive, Kernel::hyperbolic, Kernel::trig),
                         [](const auto& info) { return to_string(info.param); });

TEST(Decoder, PrefillThenQueryEqualsLastCausalRow) {
  const Tensor q = random_tensor({1, 2, 70, 8}, 4, 1.0), k = random_tensor({1, 2, 70, 8}, 5, 1.0),
               v = random_tensor({1, 2, 70, 4}, 6);
  const Projection w = Projection::draw(32, 8);
  AttentionOptions o;
  o.causal = true;
  const Tensor batch = favor_attention(q, k, v, w, o);
  Decoder dec(1, 2, 4, w);
  dec.append(tokens(k, 0, 70), tokens(v, 0, 70));
  const Tensor y = dec.query(tokens(q, 69));
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t x = 0; x < 4; ++x) EXPECT_NEAR(y.at(0, h, 0, x), batch.at(0, h, 69, x), 1e-5);
}

TEST(Decoder, EmptyStateGivesZerosAndResetClears) {
  const Projection w = Projection::draw(16, 4);
  Decoder dec(1, 1, 3, w);
  const Tensor q = random_tensor({1, 1, 1, 4}, 1), k = random_tensor({1, 1, 1, 4}, 2),
               v = random_tensor({1, 1, 1, 3}, 3);
  const Tensor before = dec.query(q);
  for (float x : before.values()) EXPECT_EQ(x, 0.0f);
  dec.append(k, v);
  // One key: the output is exactly that key's value (weight 1).
  const Tensor y = dec.query(q);
  for (int64_t x = 0; x < 3; ++x) EXPECT_NEAR(y.at(0, 0, 0, x), v.at(0, 0, 0, x), 1e-6);
  dec.reset();
  EXPECT_EQ(dec.position(), 0);
  const Tensor after = dec.query(q);
  for (float x : after.values()) EXPECT_EQ(x, 0.0f);
}

}  // namespace
}  // namespace favor

namespace favor {
namespace {

TEST(Decoder, StridedKeysEqualContiguousAtLargeNorms) {
  // The key norm enters the exponent as -|y|^2/2: both layouts accumulate it in double.
  const Tensor k = random_tensor({1, 2, 6, 16}, 1, 1e3), v = random_tensor({1, 2, 6, 4}, 2),
               q = random_tensor({1, 2, 1, 16}, 3, 1e3);
  testing::StridedCopy ks(k);
  const Projection w = Projection::draw(32, 16);
  Decoder a(1, 2, 4, w), b(1, 2, 4, w);
  for (int64_t t = 0; t < 6; ++t) {
    a.append(tokens(k, t), tokens(v, t));
    const TensorView kt{ks.view.data + t * ks.view.strides[2], {1, 2, 1, 16}, ks.view.strides};
    b.append(kt, tokens(v, t));
  }
  EXPECT_EQ(a.query(q).values(), b.query(q).values());
}

}  // namespace
}  // namespace favor
