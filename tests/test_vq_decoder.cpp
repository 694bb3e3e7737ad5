// The streaming Transformer-VQ decoder against the double reference VQ attention over
// the quantised keys, and against exact softmax attention when every key is a code.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "test_helpers.hpp"

// A namespace of its own: the unity build compiles several test files as one source
// (cmake/FavorUnity.cmake), and their helpers (Case, cases(), ...) share names.
namespace favor::test_vq_decoder {
namespace {
using testing::expect_error;
using testing::random_tensor;
using testing::tokens;

constexpr double kUnit = 0x1p-24;  // float unit roundoff

// The double reference (reference::vq_attention): the materialised VQ attention over the
// quantised keys (hard) or the GMM form (soft). [B, H, N, Dv].
std::vector<double> naive_vq(const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& codebook, double scale, double tau, bool causal) {
  VQOptions options;
  options.causal = causal;
  options.scale = scale;
  options.tau = tau;
  return reference::vq_attention(q, k, v, codebook, options).values;
}

double max_row_norm(const Tensor& t) {
  const int64_t d = t.shape()[3];
  double worst = 0.0;
  for (int64_t r = 0; r < t.numel() / d; ++r) {
    double n2 = 0.0;
    for (int64_t x = 0; x < d; ++x) n2 += double(t.values()[r * d + x]) * t.values()[r * d + x];
    worst = std::max(worst, std::sqrt(n2));
  }
  return worst;
}

double max_abs(const Tensor& t) {
  double worst = 0.0;
  for (float x : t.values()) worst = std::max(worst, std::abs(double(x)));
  return worst;
}

// Bound on |y - y_double| for a decoder row over n tokens. Each weight exp(l_s) p(s|k_j)
// carries a relative error delta; a weighted mean of values moves by at most
// 2 delta max|v - y| <= 4 delta vmax. delta: the logit scale q.C_s is a float dot of length
// D (<= D u scale |q||C|) plus the exp and the shift (4 u); soft VQ adds log p(s|k) from
// float scores 2 k.C - |C|^2 (<= 2 D u (2 |k||C| + |C|^2)) divided by tau, plus its
// log-sum-exp (8 u). Then the float sums: per-code value sums of up to n terms (n u vmax),
// soft counts likewise, and the c-term numerator and denominator (2 c u vmax).
double row_bound(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& codebook,
                 double scale, double tau, int64_t n) {
  const double D = double(q.shape()[3]), c = double(codebook.shape()[2]);
  const double qn = max_row_norm(q), kn = max_row_norm(k), cn = max_row_norm(codebook);
  const double delta_logit = D * kUnit * scale * qn * cn + 4 * kUnit;
  const double delta_p = tau > 0.0 ? 2 * D * kUnit * (2 * kn * cn + cn * cn) / tau + 8 * kUnit : 0;
  const double sums = (tau > 0.0 ? 2.0 : 1.0) * double(n) + 2 * c + 8;
  return max_abs(v) * (4 * (delta_logit + delta_p) + sums * kUnit);
}

struct Case {
  bool soft, shared;
  std::string name() const {
    return std::string(soft ? "Soft" : "Hard") + (shared ? "Shared" : "PerHead");
  }
};

class VQDecoderVsNaive : public ::testing::TestWithParam<Case> {
 protected:
  static constexpr int64_t B = 2, H = 3, N = 40, D = 16, Dv = 8, c = 12;
  const Tensor q = random_tensor({B, H, N, D}, 11, 4.0), k = random_tensor({B, H, N, D}, 12, 2.0),
               v = random_tensor({B, H, N, Dv}, 13);
  const Tensor codebook = random_tensor({1, GetParam().shared ? 1 : H, c, D}, 14, 2.0);
  const double scale = 0.25, tau = GetParam().soft ? 0.7 : 0.0;

  VQDecoder make() const { return VQDecoder(B, H, Dv, codebook, {scale, tau}); }
  // Causal vq_attention's options with this decoder's scale and tau, blocks of `block`.
  VQOptions causal_options(int64_t block) const {
    VQOptions options;
    options.causal = true;
    options.scale = scale;
    options.tau = tau;
    options.block = block;
    return options;
  }
  double bound(int64_t n) const { return row_bound(q, k, v, codebook, scale, tau, n); }

  // Compares query row i of the decoder (after tokens 0..i) with row i of `naive`.
  void expect_row(const Tensor& y, int64_t row, const std::vector<double>& naive, int64_t i) const {
    const double tol = bound(i + 1);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t x = 0; x < Dv; ++x)
          EXPECT_NEAR(y.at(b, h, row, x), naive[((b * H + h) * N + i) * Dv + x], tol)
              << "b " << b << " h " << h << " i " << i << " x " << x;
  }
};

TEST_P(VQDecoderVsNaive, TokenByTokenEqualsCausalRows) {
  const std::vector<double> naive = naive_vq(q, k, v, codebook, scale, tau, true);
  VQDecoder dec = make();
  for (int64_t i = 0; i < N; ++i) {
    dec.append(tokens(k, i), tokens(v, i));
    expect_row(dec.query(tokens(q, i)), 0, naive, i);
  }
  EXPECT_EQ(dec.position(), N);
}

TEST_P(VQDecoderVsNaive, ChunksOfThreeEqualCausalRowAtChunkEnd) {
  // After a chunk the state holds tokens 0..i for the chunk's last token i.
  const std::vector<double> naive = naive_vq(q, k, v, codebook, scale, tau, true);
  VQDecoder dec = make();
  for (int64_t t0 = 0; t0 < N; t0 += 3) {
    const int64_t n = std::min<int64_t>(3, N - t0);
    dec.append(tokens(k, t0, n), tokens(v, t0, n));
    expect_row(dec.query(tokens(q, t0 + n - 1)), 0, naive, t0 + n - 1);
  }
  EXPECT_EQ(dec.position(), N);
}

TEST_P(VQDecoderVsNaive, PrefillThenAllQueriesEqualBidirectional) {
  // One append of N tokens (the GEMM path of soft VQ), one query of N rows (a GEMM tile).
  const std::vector<double> naive = naive_vq(q, k, v, codebook, scale, tau, false);
  VQDecoder dec = make();
  dec.append(k, v);
  const Tensor y = dec.query(q);
  const double tol = bound(N);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t x = 0; x < Dv; ++x)
          EXPECT_NEAR(y.at(b, h, i, x), naive[((b * H + h) * N + i) * Dv + x], tol);
}

TEST_P(VQDecoderVsNaive, StreamingEqualsTheCausalKernel) {
  // The float kernels against each other: token-by-token decoding reproduces causal
  // vq_attention (blocks of 5, so rows meet both the block and the per-code prefix sums).
  const VQOptions options = causal_options(5);
  const Tensor causal = vq_attention(q, k, v, codebook, options);
  VQDecoder dec = make();
  for (int64_t i = 0; i < N; ++i) {
    dec.append(tokens(k, i), tokens(v, i));
    const Tensor y = dec.query(tokens(q, i));
    const double tol = 2 * bound(i + 1);  // each side within bound of the exact row
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t x = 0; x < Dv; ++x)
          EXPECT_NEAR(y.at(b, h, 0, x), causal.at(b, h, i, x), tol) << "row " << i;
  }
}

TEST_P(VQDecoderVsNaive, StepEqualsAppendThenQueryAndTheCausalKernel) {
  // VQDecoder::step runs append's and query's float operations in the same order: the same
  // bits, with a mask that differs across rows (row 1 left-padded by 7, a hole at 20 in row
  // 0). Unmasked, it reproduces causal vq_attention as the two calls do.
  std::vector<uint8_t> mask(static_cast<size_t>(B * N), 1);
  for (int64_t j = 0; j < 7; ++j) mask[static_cast<size_t>(N + j)] = 0;
  mask[20] = 0;
  const VQOptions options = causal_options(5);
  const Tensor causal = vq_attention(q, k, v, codebook, options);
  VQDecoder fused = make(), split = make(), plain = make();
  int64_t mismatches = 0;
  for (int64_t i = 0; i < N; ++i) {
    const KeyMaskView m{mask.data() + i, B, 1, N, 1};
    const Tensor y = fused.step(tokens(q, i), tokens(k, i), tokens(v, i), m);
    split.append(tokens(k, i), tokens(v, i), m);
    const Tensor ref = split.query(tokens(q, i));
    for (size_t e = 0; e < y.values().size(); ++e) mismatches += y.values()[e] != ref.values()[e];
    const Tensor yp = plain.step(tokens(q, i), tokens(k, i), tokens(v, i));
    const double tol = 2 * bound(i + 1);  // each side within bound of the exact row
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t x = 0; x < Dv; ++x)
          EXPECT_NEAR(yp.at(b, h, 0, x), causal.at(b, h, i, x), tol) << "row " << i;
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(fused.state().sums, split.state().sums);
  EXPECT_EQ(fused.position(), N);
}

TEST_P(VQDecoderVsNaive, PrefillEqualsTheCausalKernelAndLeavesAppendsState) {
  // A prompt of 25 tokens, row 1 left-padded by 7 and row 0 with a hole at 20: prefill from an
  // empty decoder is causal vq_attention (the same kernel, the default block), bit for bit;
  // the steps after it equal those after append (each within bound of the exact rows).
  constexpr int64_t P = 25;
  std::vector<uint8_t> mask(static_cast<size_t>(B * N), 1);
  for (int64_t j = 0; j < 7; ++j) mask[static_cast<size_t>(N + j)] = 0;
  mask[20] = 0;
  const KeyMaskView prompt_mask{mask.data(), B, P, N, 1};
  VQOptions options = causal_options(0);  // the default block, as prefill uses
  options.key_mask = prompt_mask;
  const Tensor causal =
      vq_attention(tokens(q, 0, P), tokens(k, 0, P), tokens(v, 0, P), codebook, options);
  VQDecoder dec = make(), ref = make();
  const Tensor y = dec.prefill(tokens(q, 0, P), tokens(k, 0, P), tokens(v, 0, P), prompt_mask);
  EXPECT_EQ(y.values(), causal.values());
  ref.append(tokens(k, 0, P), tokens(v, 0, P), prompt_mask);
  EXPECT_EQ(dec.position(), P);
  if (tau == 0.0) EXPECT_EQ(dec.state().counts, ref.state().counts);  // integers: exact
  for (int64_t i = P; i < N; ++i) {
    const KeyMaskView m{mask.data() + i, B, 1, N, 1};
    const Tensor a = dec.step(tokens(q, i), tokens(k, i), tokens(v, i), m);
    const Tensor b = ref.step(tokens(q, i), tokens(k, i), tokens(v, i), m);
    for (size_t e = 0; e < a.values().size(); ++e)
      EXPECT_NEAR(a.values()[e], b.values()[e], 2 * bound(i + 1)) << "row " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, VQDecoderVsNaive,
                         ::testing::Values(Case{false, false}, Case{false, true}, Case{true, false},
                                           Case{true, true}),
                         [](const auto& info) { return info.param.name(); });

TEST(VQDecoder, PrefillLongerThanATileEqualsLastCausalRow) {
  // 300 tokens: two row tiles (256 + 44) in append and in query.
  const int64_t N = 300, D = 8, Dv = 4;
  const Tensor q = random_tensor({1, 2, N, D}, 21, 2.0), k = random_tensor({1, 2, N, D}, 22, 2.0),
               v = random_tensor({1, 2, N, Dv}, 23),
               codebook = random_tensor({1, 2, 9, D}, 24, 2.0);
  for (const double tau : {0.0, 0.5}) {
    const std::vector<double> naive = naive_vq(q, k, v, codebook, 0.5, tau, false);
    VQDecoder dec(1, 2, Dv, codebook, {0.5, tau});
    dec.append(k, v);
    const Tensor y = dec.query(q);
    const double tol = row_bound(q, k, v, codebook, 0.5, tau, N);
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i : {int64_t{0}, int64_t{255}, int64_t{256}, N - 1})
        for (int64_t x = 0; x < Dv; ++x)
          EXPECT_NEAR(y.at(0, h, i, x), naive[(h * N + i) * Dv + x], tol) << "tau " << tau;
  }
}

TEST(VQDecoder, CodebookOfEveryKeyEqualsExactCausalAttention) {
  // Each key is a code (in reverse order, among extra random codes): its nearest code is
  // itself at distance 0, the quantised keys are the keys, and VQ attention is softmax
  // attention.
  const int64_t H = 2, N = 30, D = 16, Dv = 8, extra = 5, c = N + extra;
  const Tensor q = random_tensor({1, H, N, D}, 31, 3.0), k = random_tensor({1, H, N, D}, 32, 3.0),
               v = random_tensor({1, H, N, Dv}, 33),
               noise = random_tensor({1, H, extra, D}, 34, 3.0);
  Tensor codebook({1, H, c, D});
  for (int64_t h = 0; h < H; ++h)
    for (int64_t x = 0; x < D; ++x) {
      for (int64_t j = 0; j < N; ++j) codebook.at(0, h, N - 1 - j, x) = k.at(0, h, j, x);
      for (int64_t s = 0; s < extra; ++s) codebook.at(0, h, N + s, x) = noise.at(0, h, s, x);
    }
  ExactOptions o;
  o.causal = true;
  const reference::DTensor exact = reference::exact_attention(q, k, v, o);
  const double scale = 1.0 / std::sqrt(double(D));
  VQDecoder dec(1, H, Dv, codebook);
  for (int64_t i = 0; i < N; ++i) {
    dec.append(tokens(k, i), tokens(v, i));
    const Tensor y = dec.query(tokens(q, i));
    const double tol = row_bound(q, k, v, codebook, scale, 0.0, i + 1);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t x = 0; x < Dv; ++x)
        EXPECT_NEAR(y.at(0, h, 0, x), exact.at(0, h, i, x), tol) << "h " << h << " i " << i;
  }
}

TEST(VQDecoder, StateBytesConstantOverPositions) {
  const int64_t B = 2, H = 3, Dv = 5, c = 7;
  const Tensor codebook = random_tensor({1, 1, c, 4}, 41);
  VQDecoder dec(B, H, Dv, codebook, {std::nullopt, 0.3});
  const int64_t expected = B * H * c * (Dv + 1) * int64_t{sizeof(float)};
  EXPECT_EQ(dec.state_bytes(), expected);
  const Tensor k = random_tensor({B, H, 50, 4}, 42), v = random_tensor({B, H, 50, Dv}, 43);
  for (int round = 0; round < 3; ++round) {
    dec.append(k, v);
    EXPECT_EQ(dec.state_bytes(), expected) << "position " << dec.position();
  }
  EXPECT_EQ(dec.position(), 150);
}

TEST(VQDecoder, HugeLogitsStayFinite) {
  // |q| = 1e3 and |C| ~ 4: logits of order 1e3, far beyond float's exp range (88).
  const int64_t N = 20, D = 16, Dv = 4;
  const Tensor q = random_tensor({1, 2, N, D}, 51, 1e3), k = random_tensor({1, 2, N, D}, 52, 4.0),
               v = random_tensor({1, 2, N, Dv}, 53),
               codebook = random_tensor({1, 2, 6, D}, 54, 4.0);
  for (const double tau : {0.0, 2.0}) {
    const std::vector<double> naive = naive_vq(q, k, v, codebook, 1.0, tau, true);
    VQDecoder dec(1, 2, Dv, codebook, {1.0, tau});
    for (int64_t i = 0; i < N; ++i) {
      dec.append(tokens(k, i), tokens(v, i));
      const Tensor y = dec.query(tokens(q, i));
      const double tol = row_bound(q, k, v, codebook, 1.0, tau, i + 1);
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t x = 0; x < Dv; ++x) {
          ASSERT_TRUE(std::isfinite(y.at(0, h, 0, x))) << "tau " << tau << " i " << i;
          EXPECT_NEAR(y.at(0, h, 0, x), naive[(h * N + i) * Dv + x], tol) << "tau " << tau;
        }
    }
  }
}

TEST(VQDecoder, EmptyHeadsGiveZerosAndResetRestarts) {
  const Tensor codebook = random_tensor({1, 2, 5, 6}, 61), q = random_tensor({1, 2, 3, 6}, 62),
               k = random_tensor({1, 2, 4, 6}, 63), v = random_tensor({1, 2, 4, 3}, 64);
  VQDecoder dec(1, 2, 3, codebook);
  const Tensor empty = dec.query(q);
  for (float x : empty.values()) EXPECT_EQ(x, 0.0f);
  dec.append(k, v);
  const Tensor first = dec.query(q);
  for (float x : first.values()) EXPECT_NE(x, 0.0f);
  dec.reset();
  EXPECT_EQ(dec.position(), 0);
  const Tensor after = dec.query(q);
  for (float x : after.values()) EXPECT_EQ(x, 0.0f);
  dec.append(k, v);
  EXPECT_EQ(dec.query(q).values(), first.values());
}

TEST(VQDecoder, OneTokenGivesItsValue) {
  // One key: whatever its code, the output is that key's value (weight 1).
  const Tensor codebook = random_tensor({1, 1, 4, 5}, 71), q = random_tensor({1, 1, 1, 5}, 72),
               k = random_tensor({1, 1, 1, 5}, 73), v = random_tensor({1, 1, 1, 3}, 74);
  for (const double tau : {0.0, 1.0}) {
    VQDecoder dec(1, 1, 3, codebook, {std::nullopt, tau});
    dec.append(k, v);
    const Tensor y = dec.query(q);
    // sum_s e_s fl(p_s v) (c + 1 roundings) over sum_s e_s p_s (c), then 1/den and the
    // product: (2c + 3) u relative, c = 4.
    for (int64_t x = 0; x < 3; ++x)
      EXPECT_NEAR(y.at(0, 0, 0, x), v.at(0, 0, 0, x), 11 * kUnit * std::abs(v.at(0, 0, 0, x)));
  }
}

TEST(VQDecoder, StridedInputsEqualContiguous) {
  const Tensor codebook = random_tensor({1, 2, 6, 8}, 81), q = random_tensor({2, 2, 5, 8}, 82),
               k = random_tensor({2, 2, 5, 8}, 83), v = random_tensor({2, 2, 5, 4}, 84);
  const testing::StridedCopy ks(k), vs(v), qs(q);
  for (const double tau : {0.0, 0.5}) {
    VQDecoder a(2, 2, 4, codebook, {std::nullopt, tau}), b(2, 2, 4, codebook, {std::nullopt, tau});
    a.append(k, v);
    b.append(ks.view, vs.view);
    Tensor out_b({2, 2, 5, 4});
    b.query(qs.view, out_b.mutable_view());
    EXPECT_EQ(a.query(q).values(), out_b.values()) << "tau " << tau;
  }
}

TEST(VQDecoder, SameResultForAnyThreadCount) {
  // Each (batch, head) is one task whatever the team size.
  const Tensor codebook = random_tensor({1, 3, 64, 32}, 91), q = random_tensor({2, 3, 40, 32}, 92),
               k = random_tensor({2, 3, 40, 32}, 93), v = random_tensor({2, 3, 40, 16}, 94);
  const int saved = num_threads();
  std::vector<std::vector<float>> results;
  for (const int threads : {1, 2}) {
    set_num_threads(threads);
    VQDecoder dec(2, 3, 16, codebook, {std::nullopt, 0.5});
    dec.append(k, v);
    results.push_back(dec.query(q).values());
  }
  set_num_threads(saved);
  EXPECT_EQ(results[0], results[1]);
}

TEST(VQDecoderErrors, ConstructorNamesTheArgument) {
  const Tensor codebook = random_tensor({1, 2, 5, 6}, 1);
  expect_error([&] { VQDecoder(0, 2, 3, codebook); }, "batch: 0");
  expect_error([&] { VQDecoder(1, 0, 3, codebook); }, "heads: 0");
  expect_error([&] { VQDecoder(1, 2, 0, codebook); }, "dv: 0");
  expect_error([&] { VQDecoder(1, 3, 3, codebook); }, "codebook: shape");
  expect_error([&] { VQDecoder(1, 2, 3, random_tensor({2, 2, 5, 6}, 1)); }, "codebook: shape");
  Tensor nan = codebook;
  nan.at(0, 1, 2, 3) = std::nanf("");
  expect_error([&] { VQDecoder(1, 2, 3, nan); }, "codebook: element [0,1,2,3]");
  expect_error([&] { VQDecoder(1, 2, 3, codebook, {-1.0, 0.0}); }, "scale: -1");
  expect_error([&] { VQDecoder(1, 2, 3, codebook, {std::nullopt, -0.5}); }, "tau: ");
}

TEST(VQDecoderErrors, AppendAndQueryNameTheArgumentAndKeepTheState) {
  const Tensor codebook = random_tensor({1, 1, 5, 6}, 1), k = random_tensor({1, 2, 3, 6}, 2),
               v = random_tensor({1, 2, 3, 4}, 3), q = random_tensor({1, 2, 1, 6}, 4);
  VQDecoder dec(1, 2, 4, codebook);
  dec.append(k, v);
  const Tensor before = dec.query(q);
  expect_error([&] { dec.append(random_tensor({1, 2, 3, 5}, 1), v); }, "k: shape");
  expect_error([&] { dec.append(random_tensor({2, 2, 3, 6}, 1), v); }, "k: shape");
  expect_error([&] { dec.append(k, random_tensor({1, 2, 3, 5}, 1)); }, "v: shape");  // dv
  expect_error([&] { dec.append(k, random_tensor({1, 2, 2, 4}, 1)); }, "same token count T");
  Tensor nan = v;
  nan.at(0, 1, 2, 0) = std::nanf("");
  expect_error([&] { dec.append(k, nan); }, "v: element [0,1,2,0]");
  Tensor inf_k = k;
  inf_k.at(0, 0, 1, 5) = std::numeric_limits<float>::infinity();
  expect_error([&] { dec.append(inf_k, v); }, "k: element [0,0,1,5]");
  expect_error([&] { dec.query(random_tensor({1, 2, 1, 7}, 1)); }, "q: shape");
  Tensor nan_q = q;
  nan_q.at(0, 0, 0, 0) = std::nanf("");
  expect_error([&] { dec.query(nan_q); }, "q: element");
  Tensor out({1, 2, 1, 3});
  expect_error([&] { dec.query(q, out.mutable_view()); }, "out: shape");
  EXPECT_EQ(dec.position(), 3);
  EXPECT_EQ(dec.query(q).values(), before.values());
}

}  // namespace
}  // namespace favor::test_vq_decoder
