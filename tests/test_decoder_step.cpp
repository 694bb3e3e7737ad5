// Decoder::step (append then query of one token per row, fused) and Decoder::prefill (causal
// attention over a prompt that leaves the decoder's state behind), with positions and masks
// that differ across the batch: left padding of different lengths per row, masked tokens
// mid-sequence, decay. Oracles: append then query (the decoder's own two calls) and causal
// favor_attention, whose agreement with the float64 reference test_attention.cpp checks.
#include <gtest/gtest.h>

#include "map_fixture.hpp"
#include "test_helpers.hpp"

namespace favor::decoder_step_test {
namespace {
using testing::expect_error;
using testing::random_tensor;
using testing::tokens;

constexpr int64_t kB = 3, kH = 2, kN = 40, kD = 8, kDv = 5;

/// Row b's first {0, 5, 17}[b] tokens masked (left padding); with holes, also token 30 of
/// row 0 and tokens 22, 23 of row 1.
std::vector<uint8_t> step_mask(bool holes) {
  const int64_t pads[kB] = {0, 5, 17};
  std::vector<uint8_t> mask(static_cast<size_t>(kB * kN));
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t j = 0; j < kN; ++j) {
      const bool hole = holes && ((b == 0 && j == 30) || (b == 1 && (j == 22 || j == 23)));
      mask[static_cast<size_t>(b * kN + j)] = j >= pads[b] && !hole;
    }
  return mask;
}

/// Tokens [i0, i0 + T) of the mask.
KeyMaskView mask_at(const std::vector<uint8_t>& mask, int64_t i0, int64_t T) {
  return KeyMaskView{mask.data() + i0, kB, T, kN, 1};
}

/// Copies y [B, H, T, Dv] into rows [i0, i0 + T) of out.
void put_rows(Tensor& out, const Tensor& y, int64_t i0) {
  const Shape4 s = y.shape();
  for (int64_t b = 0; b < s[0]; ++b)
    for (int64_t h = 0; h < s[1]; ++h)
      for (int64_t t = 0; t < s[2]; ++t)
        for (int64_t x = 0; x < s[3]; ++x) out.at(b, h, i0 + t, x) = y.at(b, h, t, x);
}

struct StepCase {
  Kernel kernel;
  std::vector<double> decay;
};

class DecoderStep : public ::testing::TestWithParam<StepCase> {
 protected:
  FeatureMap map() const {
    const Projection w = Projection::draw(24, kD, {ProjectionKind::orthogonal, NormMode::chi, 6});
    FeatureMap m(w, GetParam().kernel);
    if (data_adapted(GetParam().kernel)) m.fit = KernelFit::constant(-0.1, kD);
    return m;
  }
  Decoder make() const {
    DecoderOptions o;
    o.decay = GetParam().decay;
    return Decoder(kB, kH, kDv, map(), o);
  }
  Tensor causal(const std::vector<uint8_t>& mask) const {
    AttentionOptions o;
    o.causal = true;
    o.decay = GetParam().decay;
    o.key_mask = KeyMaskView::contiguous(mask.data(), kB, kN);
    return favor_attention(q, k, v, map(), o);
  }
  /// Tokens [i0, kN) of `dec` one at a time, with step (fused) or append then query, into out.
  void run_tokens(Decoder& dec, const std::vector<uint8_t>& mask, int64_t i0, bool fused,
                  Tensor& out) const {
    for (int64_t i = i0; i < kN; ++i) {
      const KeyMaskView m = mask_at(mask, i, 1);
      if (fused) {
        put_rows(out, dec.step(tokens(q, i), tokens(k, i), tokens(v, i), m), i);
      } else {
        dec.append(tokens(k, i), tokens(v, i), m);
        put_rows(out, dec.query(tokens(q, i)), i);
      }
    }
  }
  bool decay() const { return !GetParam().decay.empty(); }
  const Tensor q = random_tensor({kB, kH, kN, kD}, 91, 1.5),
               k = random_tensor({kB, kH, kN, kD}, 92, 1.5),
               v = random_tensor({kB, kH, kN, kDv}, 93);
};

std::vector<int64_t> all_rows() {
  std::vector<int64_t> rows(kN);
  for (int64_t i = 0; i < kN; ++i) rows[size_t(i)] = i;
  return rows;
}

// Two float32 evaluations of one formula that differ in the projections' summation order
// (and, against favor_attention, the chunked sums): each within ~(N + F) 2^-24 relative of
// the exact value, as test_streaming.cpp's 1e-5.
constexpr double kTol = 1e-5;

TEST_P(DecoderStep, StepEqualsAppendThenQueryAndCausalAttention) {
  for (bool holes : {false, true}) {
    const std::vector<uint8_t> mask = step_mask(holes);
    Decoder fused = make(), split = make();
    Tensor y({kB, kH, kN, kDv}), ref({kB, kH, kN, kDv});
    run_tokens(fused, mask, 0, true, y);
    run_tokens(split, mask, 0, false, ref);
    EXPECT_LE(testing::rows_rel_error(y, ref, all_rows()), kTol) << "holes " << holes;
    EXPECT_EQ(fused.state().row_positions, split.state().row_positions);
    EXPECT_EQ(fused.position(), kN);
    // Row 2 has no kept token before 17: zeros, as append then query gives.
    for (int64_t x = 0; x < kDv; ++x) EXPECT_EQ(y.at(2, 1, 16, x), 0.0f);
    // favor_attention counts a masked token in the decay distance, the decoder does not:
    // they agree without decay, and with decay under left padding (no hole).
    if (!holes || !decay())
      EXPECT_LE(testing::rows_rel_error(y, causal(mask), all_rows()), kTol) << "holes " << holes;
  }
}

TEST_P(DecoderStep, PrefillEqualsCausalAttentionAndLeavesAppendsState) {
  for (bool holes : {false, true}) {
    const std::vector<uint8_t> mask = step_mask(holes);
    const Tensor batch = causal(mask);
    // From an empty decoder: the causal kernel itself, bit for bit.
    constexpr int64_t P = 26;
    Decoder dec = make(), ref = make();
    const Tensor yp =
        dec.prefill(tokens(q, 0, P), tokens(k, 0, P), tokens(v, 0, P), mask_at(mask, 0, P));
    AttentionOptions o;
    o.causal = true;
    o.decay = GetParam().decay;
    o.key_mask = mask_at(mask, 0, P);
    const Tensor prompt =
        favor_attention(tokens(q, 0, P), tokens(k, 0, P), tokens(v, 0, P), map(), o);
    EXPECT_EQ(yp.values(), prompt.values()) << "holes " << holes;
    ref.append(tokens(k, 0, P), tokens(v, 0, P), mask_at(mask, 0, P));
    EXPECT_EQ(dec.state().row_positions, ref.state().row_positions);
    EXPECT_EQ(dec.position(), P);
    // The steps after it equal those after append.
    Tensor y({kB, kH, kN, kDv}), y_ref({kB, kH, kN, kDv});
    run_tokens(dec, mask, P, true, y);
    run_tokens(ref, mask, P, false, y_ref);
    std::vector<int64_t> after;
    for (int64_t i = P; i < kN; ++i) after.push_back(i);
    EXPECT_LE(testing::rows_rel_error(y, y_ref, after), kTol) << "holes " << holes;
    if (!holes || !decay())
      EXPECT_LE(testing::rows_rel_error(y, batch, after), kTol) << "holes " << holes;
  }
}

TEST_P(DecoderStep, PrefillsAfterStepsContinueTheRows) {
  // Rows at different positions (left padding) when the second prefill starts: its state goes
  // in and out with each row's own decay clock.
  const std::vector<uint8_t> mask = step_mask(false);
  Decoder dec = make();
  Tensor y({kB, kH, kN, kDv});
  put_rows(y, dec.prefill(tokens(q, 0, 9), tokens(k, 0, 9), tokens(v, 0, 9), mask_at(mask, 0, 9)),
           0);
  for (int64_t i = 9; i < 12; ++i)
    put_rows(y, dec.step(tokens(q, i), tokens(k, i), tokens(v, i), mask_at(mask, i, 1)), i);
  put_rows(
      y,
      dec.prefill(tokens(q, 12, 20), tokens(k, 12, 20), tokens(v, 12, 20), mask_at(mask, 12, 20)),
      12);
  run_tokens(dec, mask, 32, true, y);
  EXPECT_LE(testing::rows_rel_error(y, causal(mask), all_rows()), kTol);
}

INSTANTIATE_TEST_SUITE_P(
    Maps, DecoderStep,
    ::testing::Values(StepCase{Kernel::positive, {}}, StepCase{Kernel::positive, {0.9, 0.5}},
                      StepCase{Kernel::trig, {}}, StepCase{Kernel::hyperbolic, {0.8}},
                      StepCase{Kernel::favorpp, {0.95}}),
    [](const auto& info) {
      return to_string(info.param.kernel) + (info.param.decay.empty() ? "" : "_decay");
    });

// A step's projections take one of two products by the step's rows (2 per head): with
// OpenBLAS's Haswell or Zen kernels (AVX2, and FAVOR_CPU=avx2 runs) favor's register-blocked
// one up to 32 (cpu/decoder_fused_step.cpp, kStepRegisterRows), OpenBLAS above and on
// AVX-512. Both against append then query (the matvec per row) and causal attention, at 16
// rows (B = 1, H = 8) and 48 (B = 3); the hybrid decoder's step (window 3, sinks 1) against
// its append then query.
TEST(DecoderStepRows, EitherProjectionProductEqualsAppendThenQuery) {
  constexpr int64_t H = 8, N = 12, D = 16, Dv = 6;
  const Projection w = Projection::draw(40, D, {ProjectionKind::orthogonal, NormMode::chi, 2});
  for (int64_t B : {1, 3}) {
    const Tensor q = random_tensor({B, H, N, D}, 31, 1.5), k = random_tensor({B, H, N, D}, 32, 1.5),
                 v = random_tensor({B, H, N, Dv}, 33);
    Decoder fused(B, H, Dv, w), split(B, H, Dv, w);
    Tensor y({B, H, N, Dv}), ref({B, H, N, Dv});
    for (int64_t i = 0; i < N; ++i) {
      put_rows(y, fused.step(tokens(q, i), tokens(k, i), tokens(v, i)), i);
      split.append(tokens(k, i), tokens(v, i));
      put_rows(ref, split.query(tokens(q, i)), i);
    }
    std::vector<int64_t> rows(N);
    for (int64_t i = 0; i < N; ++i) rows[size_t(i)] = i;
    EXPECT_LE(testing::rows_rel_error(y, ref, rows), kTol) << "B " << B;
    AttentionOptions o;
    o.causal = true;
    EXPECT_LE(testing::rows_rel_error(y, favor_attention(q, k, v, w, o), rows), kTol) << "B " << B;
    HybridDecoder hf(B, H, Dv, w, 3, 1), hs(B, H, Dv, w, 3, 1);
    for (int64_t i = 0; i < N; ++i) {
      put_rows(y, hf.step(tokens(q, i), tokens(k, i), tokens(v, i)), i);
      hs.append(tokens(k, i), tokens(v, i));
      put_rows(ref, hs.query(tokens(q, i)), i);
    }
    EXPECT_LE(testing::rows_rel_error(y, ref, rows), kTol) << "hybrid, B " << B;
  }
}

TEST(DecoderStepErrors, ShapesAndMaskNameTheArgument) {
  Decoder dec(2, 1, 3, Projection::draw(8, 4));
  const Tensor q = random_tensor({2, 1, 2, 4}, 1), k = random_tensor({2, 1, 1, 4}, 2),
               v = random_tensor({2, 1, 1, 3}, 3);
  expect_error([&] { dec.step(q, k, v); }, "q [2,1,2,4]: a step takes one token per row (T = 1)");
  const std::vector<uint8_t> mask(4, 1);
  expect_error([&] { dec.step(tokens(q, 0), k, v, KeyMaskView::contiguous(mask.data(), 2, 2)); },
               "key_mask: shape [2,2] must be [B, T] = [2,1]");
  expect_error(
      [&] {
        dec.prefill(q, random_tensor({2, 1, 3, 4}, 4), random_tensor({2, 1, 3, 3}, 5));
      },
      "same token count T");
  EXPECT_EQ(dec.position(), 0);
}

}  // namespace
}  // namespace favor::decoder_step_test
