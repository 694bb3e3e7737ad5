// Transformer-VQ attention and code assignment against the double reference
// (reference/naive_vq.hpp). Tolerance rule (docs/numerics.md, rule 1): the fast float32
// output's relative Frobenius error against the double reference is at most twice that of
// the naive float32 implementation of the same formula, plus 1e-6 (8 float32 ulps). The
// rule scales itself with N, c, D and the size of the logits; the kernels' extra rounding is
// the same kind (logits from a GEMM, exps, sums of N + c positive terms).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "reference/naive_vq.hpp"
#include "test_helpers.hpp"

// A namespace of its own: the unity build compiles several test files as one source
// (cmake/FavorUnity.cmake), and their helpers (Case, cases(), ...) share names.
namespace favor::test_vq_attention {
namespace {
using testing::expect_error;
using testing::random_tensor;
using testing::rel_error;
using testing::ThreadCount;

double resolved_scale(const VQOptions& o, int64_t d) {
  return o.scale ? *o.scale : 1.0 / std::sqrt(double(d));
}

// The 2x-naive-float bound of rule 1 for `fast` against the double reference.
struct Check {
  double err, bound;
};
Check against_reference(const Tensor& fast, TensorView q, TensorView k, TensorView v,
                        TensorView codebook, const VQOptions& o) {
  const auto ref = reference::vq_attention(q, k, v, codebook, o);
  const auto naive32 =
      reference::naive::vq_attention<float>(q, k, v, codebook, o, resolved_scale(o, q.shape[3]));
  return {rel_error(fast, ref.values), 2.0 * rel_error(naive32, ref.values) + 1e-6};
}

// Whether key j of head (b, h) has a near-tie: its two nearest codes closer in squared
// distance than the float rounding of the GEMM form |C|^2 - 2 k.C allows to separate, about
// D 2^-24 (|k|^2 + |C|^2) (here bounded by 1e-5 (|k|^2 + max |C|^2), a 10x margin for D <= 16).
bool near_tie(const Tensor& k, const Tensor& codebook, int64_t b, int64_t h, int64_t j) {
  double d1 = std::numeric_limits<double>::infinity(), d2 = d1, k2 = 0.0, c2 = 0.0;
  const int64_t D = k.shape()[3];
  for (int64_t x = 0; x < D; ++x) k2 += double(k.at(b, h, j, x)) * k.at(b, h, j, x);
  for (int64_t s = 0; s < codebook.shape()[2]; ++s) {
    const double d = reference::naive::distance2<double>(k, codebook, b, h, j, s);
    d2 = d < d1 ? d1 : std::min(d2, d);
    d1 = std::min(d1, d);
    double n2 = 0.0;
    for (int64_t x = 0; x < D; ++x) {
      const double cx = reference::naive::code_at(codebook, h, s, x);
      n2 += cx * cx;
    }
    c2 = std::max(c2, n2);
  }
  return d2 - d1 < 1e-5 * (k2 + c2);
}

int64_t near_ties(const Tensor& k, const Tensor& codebook) {
  int64_t count = 0;
  for (int64_t b = 0; b < k.shape()[0]; ++b)
    for (int64_t h = 0; h < k.shape()[1]; ++h)
      for (int64_t j = 0; j < k.shape()[2]; ++j) count += near_tie(k, codebook, b, h, j);
  return count;
}

// ---------------------------------------------------------------------------------------
// Code assignment

TEST(VQAssign, MatchesReferenceWithDistances) {
  // N = 300 crosses the 256-row tile; shared and per-head codebooks; a strided key view.
  const Tensor k = random_tensor({2, 3, 300, 8}, 11);
  for (int64_t hc : {3, 1}) {
    const Tensor codebook = random_tensor({1, hc, 16, 8}, 12 + hc);
    ASSERT_LE(near_ties(k, codebook), 2) << "many near-ties: pick another seed";
    const auto ref = reference::vq_assign(k, codebook);
    testing::StridedCopy ks(k);
    std::vector<int32_t> codes(ref.size());
    std::vector<float> dist(ref.size());
    vq_assign(ks.view, codebook, codes.data(), dist.data());
    const std::vector<int32_t> plain = vq_assign(k, codebook);
    EXPECT_EQ(codes, plain);
    for (size_t r = 0; r < ref.size(); ++r) {
      const int64_t j = static_cast<int64_t>(r) % 300, bh = static_cast<int64_t>(r) / 300;
      if (near_tie(k, codebook, bh / 3, bh % 3, j)) continue;  // either code is right
      EXPECT_EQ(codes[r], ref[r]) << "key " << r;
      const double exact =
          reference::naive::distance2<double>(k, codebook, bh / 3, bh % 3, j, ref[r]);
      // Float differences (relative error 2^-24 each, 2^-23 once squared), summed in double,
      // rounded once to float (2^-24): 3 2^-24 relative.
      EXPECT_NEAR(dist[r], exact, 3 * 0x1p-24 * exact) << "key " << r;
    }
  }
}

TEST(VQAssign, KeysFarFromTheOriginKeepTheirCodes) {
  // Keys that share a large offset with a small spread (|k| ~ 440 and ~ 4400 against gaps of
  // ~0.2): the GEMM form |C|^2 - 2 k.C cancels there (its error, eps |k|^2 ~ 0.01 - 1, is
  // larger than the gaps), and put half the keys on a wrong code before assignment centred
  // the keys and codes on the codes' mean. With the codebook made of the keys themselves
  // every key must find itself (distance 0) and VQ attention must be exact attention.
  const int64_t N = 64, D = 16;
  for (const float offset : {110.0f, 1100.0f}) {
    Tensor k = random_tensor({1, 1, N, D}, 41);
    for (float& x : k.values()) x = offset + 0.05f * x;
    const Tensor codebook(Shape4{1, 1, N, D}, k.values());
    std::vector<int32_t> codes(N);
    std::vector<float> dist(N);
    vq_assign(k, codebook, codes.data(), dist.data());
    for (int64_t j = 0; j < N; ++j) {
      EXPECT_EQ(codes[j], j) << "offset " << offset;
      EXPECT_EQ(dist[j], 0.0f) << "offset " << offset;
    }
    const Tensor q = random_tensor({1, 1, N, D}, 42, 2.0), v = random_tensor({1, 1, N, 4}, 43);
    VQOptions o;
    o.scale = 1.0;  // q.k^ spans ~offset: the logits differ by O(1) between keys
    ExactOptions e;
    e.scale = 1.0;
    const Tensor fast = vq_attention(q, k, v, codebook, o);
    const auto exact = reference::exact_attention(q, k, v, e);
    // The logits themselves are large (|q| |k| ~ offset sqrt(D)): float rounding of scale
    // q.C, about eps |q| |k|, bounds the error; 1e-3 is 10x that at offset 1100.
    EXPECT_LT(rel_error(fast, exact.values), offset < 500 ? 1e-4 : 1e-3) << "offset " << offset;
  }
}

// ---------------------------------------------------------------------------------------
// Attention against the double reference

struct Case {
  int64_t B, H, Hc, Nq, Nk, D, Dv, c;
  double tau;
  bool causal, masked;
  int64_t block;
};

std::string name_of(const Case& c) {
  return std::string(c.tau == 0 ? "hard" : "soft") + (c.causal ? "_causal" : "_bidir") +
         (c.masked ? "_masked" : "") + "_Hc" + std::to_string(c.Hc) + "_N" + std::to_string(c.Nq) +
         "x" + std::to_string(c.Nk) + "_D" + std::to_string(c.D) + "_Dv" + std::to_string(c.Dv) +
         "_c" + std::to_string(c.c) + "_L" + std::to_string(c.block);
}

class VQAttentionVsReference : public ::testing::TestWithParam<Case> {};

TEST_P(VQAttentionVsReference, WithinTwiceNaiveFloatError) {
  const Case c = GetParam();
  const Tensor q = random_tensor({c.B, c.H, c.Nq, c.D}, 1, 2.0);
  const Tensor k = random_tensor({c.B, c.H, c.Nk, c.D}, 2, 2.0);
  const Tensor v = random_tensor({c.B, c.H, c.Nk, c.Dv}, 3);
  const Tensor codebook = random_tensor({1, c.Hc, c.c, c.D}, 4, 2.0);
  std::vector<uint8_t> mask = testing::periodic_mask(static_cast<size_t>(c.B * c.Nk), 3, 1);
  VQOptions o;
  o.causal = c.causal;
  o.tau = c.tau;
  o.block = c.block;
  if (c.masked) o.key_mask = KeyMaskView::contiguous(mask.data(), c.B, c.Nk);
  if (c.tau == 0) ASSERT_EQ(near_ties(k, codebook), 0) << name_of(c) << ": pick another seed";
  VQStats stats;
  const Tensor fast = vq_attention(q, k, v, codebook, o, &stats);
  const Check r = against_reference(fast, q, k, v, codebook, o);
  EXPECT_LE(r.err, r.bound) << name_of(c);
  // Rows that see no key: masked prefixes (causal) or fully masked batches.
  int64_t expected_zero = 0;
  for (int64_t b = 0; c.masked && b < c.B; ++b)
    for (int64_t i = 0; i < c.Nq; ++i) {
      bool any = false;
      for (int64_t j = 0; j <= (c.causal ? i : c.Nk - 1); ++j) any |= mask[b * c.Nk + j] != 0;
      expected_zero += any ? 0 : c.H;
    }
  EXPECT_EQ(stats.zero_rows, expected_zero) << name_of(c);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (double tau : {0.0, 0.5}) {
    for (bool causal : {false, true}) {
      const auto nk = [&](int64_t n, int64_t other) { return causal ? n : other; };
      // Per-head and shared codebooks; tails: N = 1, c = 1, odd D and Dv, N across blocks
      // (64) and the row tile (256), a prime block length.
      out.push_back({2, 3, 3, 70, nk(70, 45), 8, 5, 16, tau, causal, false, 0});
      out.push_back({2, 3, 1, 70, nk(70, 91), 8, 5, 16, tau, causal, true, 0});
      out.push_back({1, 2, 2, 1, 1, 4, 3, 7, tau, causal, false, 0});
      out.push_back({1, 1, 1, 33, 33, 7, 9, 1, tau, causal, false, 0});
      out.push_back({1, 1, 1, 129, nk(129, 64), 5, 3, 33, tau, causal, true, 13});
      out.push_back({1, 1, 1, 300, nk(300, 257), 6, 4, 9, tau, causal, false, 0});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(VQAttention, VQAttentionVsReference, ::testing::ValuesIn(cases()));

// A codebook holding every key (c = N): each key is its own code, so hard VQ attention is
// exact softmax attention.
TEST(VQAttention, CodebookOfAllKeysIsExactAttention) {
  const int64_t H = 2, N = 37, D = 8;
  const Tensor q = random_tensor({1, H, N, D}, 21, 2.0);
  const Tensor k = random_tensor({1, H, N, D}, 22, 2.0);
  const Tensor v = random_tensor({1, H, N, 5}, 23);
  const Tensor codebook(Shape4{1, H, N, D}, k.values());
  std::vector<uint8_t> mask = testing::periodic_mask(N, 4, 2);
  ASSERT_EQ(vq_assign(k, codebook), reference::vq_assign(k, codebook));
  for (bool causal : {false, true})
    for (bool masked : {false, true}) {
      VQOptions o;
      o.causal = causal;
      o.block = 8;
      ExactOptions e;
      e.causal = causal;
      if (masked) o.key_mask = e.key_mask = KeyMaskView::contiguous(mask.data(), 1, N);
      VQStats stats;
      const Tensor fast = vq_attention(q, k, v, codebook, o, &stats);
      const auto exact = reference::exact_attention(q, k, v, e);
      const auto naive32 =
          reference::naive::vq_attention<float>(q, k, v, codebook, o, resolved_scale(o, D));
      // The float naive VQ is a float softmax over the same keys: the rule-1 bound.
      EXPECT_LE(rel_error(fast, exact.values), 2.0 * rel_error(naive32, exact.values) + 1e-6)
          << "causal " << causal << " masked " << masked;
      EXPECT_EQ(stats.zero_rows, 0);
    }
}

// ---------------------------------------------------------------------------------------
// Causal structure

TEST(VQAttention, CausalBlockLengthInvariance) {
  const int64_t N = 150;
  const Tensor q = random_tensor({1, 2, N, 8}, 31, 2.0);
  const Tensor k = random_tensor({1, 2, N, 8}, 32, 2.0);
  const Tensor v = random_tensor({1, 2, N, 6}, 33);
  const Tensor codebook = random_tensor({1, 2, 24, 8}, 34, 2.0);
  std::vector<uint8_t> mask = testing::periodic_mask(N, 5, 3);
  for (double tau : {0.0, 0.3}) {
    VQOptions o;
    o.causal = true;
    o.tau = tau;
    o.key_mask = KeyMaskView::contiguous(mask.data(), 1, N);
    o.block = N;
    const Tensor whole = vq_attention(q, k, v, codebook, o);
    const Check r = against_reference(whole, q, k, v, codebook, o);
    EXPECT_LE(r.err, r.bound);
    for (int64_t L : {1, 7, 64}) {
      o.block = L;
      const Tensor blocked = vq_attention(q, k, v, codebook, o);
      // Both are within the rule-1 bound of the reference: their distance is within twice it.
      EXPECT_LE(
          rel_error(blocked, std::vector<double>(whole.values().begin(), whole.values().end())),
          2.0 * r.bound)
          << "tau " << tau << " L " << L;
    }
  }
}

TEST(VQAttention, CausalOutputsIgnoreLaterTokens) {
  const int64_t N = 80, t = 37, D = 8, Dv = 4;  // t inside a block of 16
  const Tensor q = random_tensor({1, 2, N, D}, 41, 2.0);
  const Tensor k = random_tensor({1, 2, N, D}, 42, 2.0);
  const Tensor v = random_tensor({1, 2, N, Dv}, 43);
  const Tensor codebook = random_tensor({1, 1, 12, D}, 44, 2.0);
  for (double tau : {0.0, 0.2}) {
    VQOptions o;
    o.causal = true;
    o.tau = tau;
    o.block = 16;
    const Tensor base = vq_attention(q, k, v, codebook, o);
    Tensor q2 = q, k2 = k, v2 = v;
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t x = 0; x < D; ++x) {
        q2.at(0, h, t, x) += 3.0f;
        k2.at(0, h, t, x) = -k2.at(0, h, t, x) + 1.0f;
      }
      for (int64_t x = 0; x < Dv; ++x) v2.at(0, h, t, x) *= -7.0f;
    }
    const Tensor changed = vq_attention(q2, k2, v2, codebook, o);
    for (int64_t h = 0; h < 2; ++h) {
      const size_t head = static_cast<size_t>(h * N * Dv);
      EXPECT_EQ(std::memcmp(base.data() + head, changed.data() + head, t * Dv * sizeof(float)), 0)
          << "rows before t changed, tau " << tau;
      bool row_t_moved = false;
      for (int64_t x = 0; x < Dv; ++x) row_t_moved |= base.at(0, h, t, x) != changed.at(0, h, t, x);
      EXPECT_TRUE(row_t_moved) << "tau " << tau;
    }
  }
}

TEST(VQAttention, MaskedPrefixGivesCountedZeroRows) {
  const int64_t B = 2, H = 2, N = 40, masked = 9;
  const Tensor q = random_tensor({B, H, N, 8}, 51, 2.0);
  const Tensor k = random_tensor({B, H, N, 8}, 52, 2.0);
  const Tensor v = random_tensor({B, H, N, 3}, 53);
  const Tensor codebook = random_tensor({1, H, 10, 8}, 54, 2.0);
  std::vector<uint8_t> mask(B * N, 1);
  for (int64_t j = 0; j < masked; ++j) mask[j] = 0;  // batch 0's first keys
  for (double tau : {0.0, 0.4}) {
    VQOptions o;
    o.causal = true;
    o.tau = tau;
    o.block = 4;
    o.key_mask = KeyMaskView::contiguous(mask.data(), B, N);
    VQStats stats;
    const Tensor out = vq_attention(q, k, v, codebook, o, &stats);
    EXPECT_EQ(stats.zero_rows, H * masked);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < masked; ++i)
        for (int64_t x = 0; x < 3; ++x) EXPECT_EQ(out.at(0, h, i, x), 0.0f);
    const Check r = against_reference(out, q, k, v, codebook, o);
    EXPECT_LE(r.err, r.bound) << "tau " << tau;
    // Bidirectional with every key of batch 1 masked: all its rows are zeros.
    std::vector<uint8_t> none(B * N, 1);
    std::fill(none.begin() + N, none.end(), 0);
    o.causal = false;
    o.key_mask = KeyMaskView::contiguous(none.data(), B, N);
    const Tensor bidir = vq_attention(q, k, v, codebook, o, &stats);
    EXPECT_EQ(stats.zero_rows, H * N);
    for (int64_t h = 0; h < H; ++h) EXPECT_EQ(bidir.at(1, h, N - 1, 2), 0.0f);
  }
}

// ---------------------------------------------------------------------------------------
// Soft VQ, range, layout, threads

TEST(VQAttention, SoftConvergesToHard) {
  const Tensor q = random_tensor({1, 2, 60, 8}, 61, 2.0);
  const Tensor k = random_tensor({1, 2, 60, 8}, 62, 2.0);
  const Tensor v = random_tensor({1, 2, 60, 4}, 63);
  const Tensor codebook = random_tensor({1, 2, 12, 8}, 64, 2.0);
  for (bool causal : {false, true}) {
    VQOptions o;
    o.causal = causal;
    const auto hard = reference::vq_attention(q, k, v, codebook, o);
    double previous = std::numeric_limits<double>::infinity();
    for (double tau : {1.0, 0.1, 0.01, 0.001}) {
      o.tau = tau;
      const double err = rel_error(vq_attention(q, k, v, codebook, o), hard.values);
      EXPECT_LT(err, previous) << "tau " << tau << " causal " << causal;
      previous = err;
    }
    // At tau = 0.001 a key's second code has weight exp(-gap / tau), gap = the difference of
    // squared distances: negligible here, so only float rounding is left.
    EXPECT_LT(previous, 1e-5) << "causal " << causal;
  }
}

TEST(VQAttention, LargeLogitsStayFinite) {
  // scale = 1/4, |q| ~ 40, |C| ~ 20: logits scale q.C up to ~200 (exp overflows float at 88).
  const int64_t N = 50, D = 16;
  const Tensor q = random_tensor({1, 2, N, D}, 71, 40.0);
  Tensor codebook = random_tensor({1, 2, 8, D}, 72, 20.0);
  Tensor k = random_tensor({1, 2, N, D}, 73, 2.0);
  for (int64_t h = 0; h < 2; ++h)  // keys near the codes
    for (int64_t j = 0; j < N; ++j)
      for (int64_t x = 0; x < D; ++x) k.at(0, h, j, x) += codebook.at(0, h, j % 8, x);
  const Tensor v = random_tensor({1, 2, N, 4}, 74);
  for (double tau : {0.0, 5.0})
    for (bool causal : {false, true}) {
      VQOptions o;
      o.causal = causal;
      o.tau = tau;
      o.block = 16;
      VQStats stats;
      const Tensor out = vq_attention(q, k, v, codebook, o, &stats);
      for (float y : out.values()) ASSERT_TRUE(std::isfinite(y));
      EXPECT_EQ(stats.zero_rows, 0);
      const Check r = against_reference(out, q, k, v, codebook, o);
      EXPECT_LE(r.err, r.bound) << "tau " << tau << " causal " << causal;
    }
  // The premise: some logit is far beyond float's exp range.
  double top = 0.0;
  for (int64_t i = 0; i < N; ++i)
    for (int64_t s = 0; s < 8; ++s) {
      double dot = 0.0;
      for (int64_t x = 0; x < D; ++x) dot += double(q.at(0, 0, i, x)) * codebook.at(0, 0, s, x);
      top = std::max(top, dot / 4.0);
    }
  EXPECT_GT(top, 150.0);
}

TEST(VQAttention, StridedViewsAndThreadCountsGiveIdenticalBits) {
  ThreadCount restore;
  const Tensor q = random_tensor({2, 3, 45, 8}, 81, 2.0);
  const Tensor k = random_tensor({2, 3, 45, 8}, 82, 2.0);
  const Tensor v = random_tensor({2, 3, 45, 5}, 83);
  const Tensor codebook = random_tensor({1, 3, 10, 8}, 84, 2.0);
  testing::StridedCopy qs(q), ks(k), vs(v);
  for (double tau : {0.0, 0.5})
    for (bool causal : {false, true}) {
      VQOptions o;
      o.causal = causal;
      o.tau = tau;
      o.block = 8;
      set_num_threads(1);
      const Tensor one = vq_attention(q, k, v, codebook, o);
      set_num_threads(2);
      const Tensor two = vq_attention(q, k, v, codebook, o);
      // Strided inputs and a strided output ([B, N, H, Dv] storage).
      std::vector<float> storage(one.values().size());
      const Shape4 s = one.shape();
      MutableTensorView out{storage.data(), s, {s[2] * s[1] * s[3], s[3], s[1] * s[3], 1}};
      vq_attention(qs.view, ks.view, vs.view, codebook, out, o);
      Tensor strided(s);
      for (int64_t b = 0; b < s[0]; ++b)
        for (int64_t h = 0; h < s[1]; ++h)
          for (int64_t n = 0; n < s[2]; ++n)
            for (int64_t x = 0; x < s[3]; ++x) strided.at(b, h, n, x) = out.at(b, h, n, x);
      EXPECT_EQ(one.values(), two.values()) << "tau " << tau << " causal " << causal;
      EXPECT_EQ(one.values(), strided.values()) << "tau " << tau << " causal " << causal;
    }
}

// ---------------------------------------------------------------------------------------
// Errors

TEST(VQAttention, BadInputNamesTheArgument) {
  const Tensor q = random_tensor({1, 2, 6, 8}, 91), k = random_tensor({1, 2, 6, 8}, 92);
  const Tensor v = random_tensor({1, 2, 6, 4}, 93);
  const Tensor codebook = random_tensor({1, 2, 5, 8}, 94);
  expect_error([&] { vq_attention(q, k, v, random_tensor({1, 2, 5, 7}, 1)); }, "codebook: shape");
  expect_error([&] { vq_attention(q, k, v, random_tensor({1, 3, 5, 8}, 1)); }, "codebook: shape");
  expect_error([&] { vq_attention(q, k, v, random_tensor({2, 2, 5, 8}, 1)); }, "codebook: shape");
  Tensor bad = codebook;
  bad.at(0, 1, 3, 2) = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { vq_attention(q, k, v, bad); }, "codebook: element [0,1,3,2] is nan");
  expect_error([&] { vq_assign(k, bad); }, "codebook: element");
  expect_error([&] { vq_assign(k, random_tensor({1, 2, 5, 3}, 1)); }, "codebook: shape");
  VQOptions o;
  o.tau = -0.5;
  expect_error([&] { vq_attention(q, k, v, codebook, o); }, "tau: -0.5");
  o.tau = std::numeric_limits<double>::infinity();
  expect_error([&] { vq_attention(q, k, v, codebook, o); }, "tau:");
  // Below 1e-30, 1/tau overflows float: refused (it is hard VQ, tau = 0), also in the
  // backward pass and the decoder; 1e-30 itself is hard VQ to float precision.
  o.tau = 1e-40;
  expect_error([&] { vq_attention(q, k, v, codebook, o); }, "tau: 1e-40 must be 0 (hard VQ)");
  expect_error([&] { vq_attention_backward(q, k, v, v, codebook, o); }, "tau: 1e-40");
  expect_error([&] { VQDecoder(1, 2, 4, codebook, {std::nullopt, 1e-40}); }, "tau: 1e-40");
  o.tau = 1e-30;
  const Tensor tiny = vq_attention(q, k, v, codebook, o);
  const Tensor hard = vq_attention(q, k, v, codebook);
  for (int64_t i = 0; i < hard.numel(); ++i) EXPECT_FLOAT_EQ(tiny.values()[i], hard.values()[i]);
  o = VQOptions{};
  o.causal = true;
  o.block = -3;
  expect_error([&] { vq_attention(q, k, v, codebook, o); }, "block: -3");
  // The output may not overlap an input (here v, and the codebook).
  Tensor vv = random_tensor({1, 2, 6, 4}, 95);
  expect_error([&] { vq_attention(q, k, vv, codebook, vv.mutable_view()); }, "out");
  Tensor cb = random_tensor({1, 2, 6, 4}, 96);
  expect_error(
      [&] {
        vq_attention(q, k, v, TensorView{cb.data(), {1, 2, 3, 8}, {48, 24, 8, 1}},
                     cb.mutable_view());
      },
      "out");
  expect_error([&] { vq_assign(k, codebook, nullptr); }, "codes");
}

}  // namespace
}  // namespace favor::test_vq_attention
