// FAVOR kernels against the double-precision reference (same projection), and exact
// attention against the naive double softmax. Tolerance rule (docs/numerics.md): the fast
// float32 result's error against the double reference is at most twice that of a naive
// float32 implementation of the same formula, plus 8 float32 ulps of slack (1e-6).
#include <gtest/gtest.h>

#include <vector>

#include "reference/naive.hpp"
#include "test_helpers.hpp"

namespace favor {
namespace {
using testing::random_tensor;
using testing::rel_error;

struct Case {
  int64_t B, H, Nq, Nk, D, Dv, m;
  Kernel kernel;
  bool causal;
  bool masked;
  bool strided;
  double norm;  // row norm of q and k
};

std::string name_of(const Case& c) {
  return to_string(c.kernel) + (c.causal ? "_causal" : "_bidir") + (c.masked ? "_masked" : "") +
         (c.strided ? "_strided" : "") + "_N" + std::to_string(c.Nq) + "x" + std::to_string(c.Nk) +
         "_D" + std::to_string(c.D) + "_Dv" + std::to_string(c.Dv) + "_m" + std::to_string(c.m);
}

class FavorVsReference : public ::testing::TestWithParam<Case> {};

TEST_P(FavorVsReference, WithinTwiceNaiveFloatError) {
  const Case c = GetParam();
  const Tensor q = random_tensor({c.B, c.H, c.Nq, c.D}, 1, c.norm);
  const Tensor k = random_tensor({c.B, c.H, c.Nk, c.D}, 2, c.norm);
  const Tensor v = random_tensor({c.B, c.H, c.Nk, c.Dv}, 3);
  const Projection w = Projection::draw(c.m, c.D, {ProjectionKind::orthogonal, NormMode::chi, 7});
  std::vector<uint8_t> mask(static_cast<size_t>(c.B * c.Nk), 1);
  AttentionOptions o;
  o.kernel = c.kernel;
  o.causal = c.causal;
  if (c.masked) {
    mask = testing::periodic_mask(mask.size(), 3, 1);  // every third key out
    o.key_mask = KeyMaskView::contiguous(mask.data(), c.B, c.Nk);
  }
  testing::StridedCopy qs(q), ks(k), vs(v);
  const TensorView qv = c.strided ? qs.view : q.view();
  const TensorView kv = c.strided ? ks.view : k.view();
  const TensorView vv = c.strided ? vs.view : v.view();

  AttentionStats stats;
  const Tensor fast = favor_attention(qv, kv, vv, w, o, &stats);
  const auto ref = reference::favor_attention(q, k, v, w, o);
  o.scale = 1.0 / std::sqrt(double(c.D));
  const auto naive32 = reference::naive::favor_attention<float>(q, k, v, w, o);
  const double err = rel_error(fast, ref.values);
  const double naive_err = rel_error(naive32, ref.values);
  EXPECT_LE(err, 2.0 * naive_err + 1e-6) << name_of(c) << " naive float error " << naive_err;
  EXPECT_EQ(stats.zero_rows, 0);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (Kernel kernel : {Kernel::positive, Kernel::hyperbolic, Kernel::trig}) {
    for (bool causal : {false, true}) {
      // Tails: N below, at, above and across the chunk (64) and tile (128); odd D; m not a
      // multiple of the SIMD width; N = 1, m = 1, D = 1.
      out.push_back({2, 3, 150, causal ? 150 : 203, 16, 12, 37, kernel, causal, false, false, 1.0});
      out.push_back({1, 2, 64, 64, 7, 5, 16, kernel, causal, false, false, 1.0});
      out.push_back({1, 1, 129, 129, 33, 65, 100, kernel, causal, true, false, 1.0});
      out.push_back({2, 2, 65, causal ? 65 : 31, 8, 3, 24, kernel, causal, true, true, 1.0});
      out.push_back({1, 1, 1, 1, 4, 4, 8, kernel, causal, false, false, 1.0});
      out.push_back({1, 1, 17, 17, 1, 1, 1, kernel, causal, false, false, 0.5});
      out.push_back({1, 1, 300, 300, 16, 16, 1, kernel, causal, false, true, 0.5});
      // The row tile (256) and the causal chunk (32): exactly, one over, two tiles + 1.
      out.push_back({1, 2, 256, 256, 12, 10, 20, kernel, causal, false, false, 1.0});
      out.push_back({1, 1, 257, 257, 12, 10, 20, kernel, causal, true, false, 1.0});
      out.push_back({1, 1, 513, 513, 5, 3, 9, kernel, causal, false, true, 1.0});
      // Short sequences with a large state, where bidirectional attention takes the short
      // path (cpu/favor_short.cpp, (phi(Q) phi(K)^T) [V | 1]): masked, strided, Nq != Nk.
      out.push_back({1, 2, 20, causal ? 20 : 33, 8, 32, 64, kernel, causal, true, false, 1.0});
      out.push_back({2, 1, 9, 9, 5, 40, 48, kernel, causal, false, true, 1.0});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Kernels, FavorVsReference, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return name_of(info.param); });

// The short path (no key state: (phi(Q) phi(K)^T) [V | 1], cpu/favor_short.cpp) and the
// tiled path (the key state phi(K)^T [V | 1] first) give the same outputs to float rounding,
// for shared and per-head projections (FAVOR++ / FAVOR# fits), two-sided and trig features
// and a key mask. Query rows do not interact: 12 queries take the short path (8 heads of 12
// keys, m = 64), 300 queries (more than a tile) the tiled one, and their first 12 rows are
// the same queries. A saved context (the backward's key state) changes no output bit.
TEST(FavorAttention, ShortPathEqualsTiledPath) {
  const int64_t B = 2, H = 4, nq = 12, long_nq = 300, nk = 12, D = 16, Dv = 24, m = 64;
  const Tensor long_q = random_tensor({B, H, long_nq, D}, 21, 1.0);
  Tensor q({B, H, nq, D});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < nq; ++i)
        for (int64_t x = 0; x < D; ++x) q.at(b, h, i, x) = long_q.at(b, h, i, x);
  const Tensor k = random_tensor({B, H, nk, D}, 22, 1.0), v = random_tensor({B, H, nk, Dv}, 23);
  std::vector<uint8_t> mask = testing::periodic_mask(static_cast<size_t>(B * nk), 5, 2);
  const Projection w = Projection::draw(m, D, {ProjectionKind::orthogonal, NormMode::chi, 3});
  for (Kernel kernel :
       {Kernel::positive, Kernel::trig, Kernel::hyperbolic, Kernel::favorpp, Kernel::favorsharp}) {
    for (bool masked : {false, true}) {
      AttentionOptions o;
      o.kernel = kernel;
      if (masked) o.key_mask = KeyMaskView::contiguous(mask.data(), B, nk);
      if (data_adapted(kernel)) o.fit = fit_kernel(kernel, q, k);
      const Tensor short_path = favor_attention(q, k, v, w, o);
      const Tensor tiled = favor_attention(long_q, k, v, w, o);
      std::vector<double> head_rows;  // rows 0..nq-1 of the tiled output
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < nq; ++i)
            for (int64_t x = 0; x < Dv; ++x) head_rows.push_back(tiled.at(b, h, i, x));
      // Norm-wise: both round the same terms in another order (F + nk sums per entry).
      EXPECT_LE(testing::rel_error(short_path, head_rows), 1e-6)
          << to_string(kernel) << (masked ? " masked" : "");
      Tensor with_context({B, H, nq, Dv});
      AttentionContext ctx;
      favor_attention(q, k, v, w, with_context.mutable_view(), o, &ctx);
      EXPECT_EQ(with_context.values(), short_path.values()) << to_string(kernel);
    }
  }
}

TEST(FavorAttention, MaskedKeysEqualRemovedKeys) {
  // Bidirectional attention with keys masked out equals attention over the kept keys only:
  // masked keys leave both the numerator and the denominator.
  const int64_t nk = 90;
  const Tensor q = random_tensor({1, 2, 40, 8}, 11, 1.0);
  const Tensor k = random_tensor({1, 2, nk, 8}, 12, 1.0);
  const Tensor v = random_tensor({1, 2, nk, 6}, 13);
  std::vector<uint8_t> mask(nk);
  std::vector<int64_t> kept;
  for (int64_t j = 0; j < nk; ++j) {
    mask[j] = (j * 7) % 5 < 3;
    if (mask[j]) kept.push_back(j);
  }
  Tensor k2({1, 2, int64_t(kept.size()), 8}), v2({1, 2, int64_t(kept.size()), 6});
  for (int64_t h = 0; h < 2; ++h)
    for (size_t j = 0; j < kept.size(); ++j) {
      for (int64_t x = 0; x < 8; ++x) k2.at(0, h, j, x) = k.at(0, h, kept[j], x);
      for (int64_t x = 0; x < 6; ++x) v2.at(0, h, j, x) = v.at(0, h, kept[j], x);
    }
  const Projection w = Projection::draw(64, 8, {ProjectionKind::iid, NormMode::chi, 3});
  AttentionOptions o;
  o.key_mask = KeyMaskView::contiguous(mask.data(), 1, nk);
  const Tensor masked = favor_attention(q, k, v, w, o);
  const Tensor removed = favor_attention(q, k2, v2, w, AttentionOptions{});
  EXPECT_LE(testing::max_rel_diff(masked, removed, 1e-3), 1e-5);
}

TEST(FavorAttention, AllKeysMaskedGivesZeroRows) {
  const Tensor q = random_tensor({2, 1, 10, 4}, 1), k = random_tensor({2, 1, 12, 4}, 2),
               v = random_tensor({2, 1, 12, 3}, 3);
  std::vector<uint8_t> mask(24, 1);
  for (int j = 0; j < 12; ++j) mask[j] = 0;  // batch 0: every key masked
  const Projection w = Projection::draw(16, 4);
  for (bool causal : {false, true}) {
    AttentionOptions o;
    o.causal = causal;
    o.key_mask = KeyMaskView::contiguous(mask.data(), 2, 12);
    Tensor kq = causal ? random_tensor({2, 1, 12, 4}, 1) : q;
    AttentionStats stats;
    const Tensor y = favor_attention(kq, k, v, w, o, &stats);
    EXPECT_EQ(stats.zero_rows, kq.shape()[2]) << "causal " << causal;
    for (int64_t i = 0; i < kq.shape()[2]; ++i)
      for (int64_t x = 0; x < 3; ++x) {
        EXPECT_EQ(y.at(0, 0, i, x), 0.0f);
        EXPECT_NE(y.at(1, 0, i, x), 0.0f);
      }
  }
}

TEST(FavorAttention, CausalMaskedPrefixRowsAreZero) {
  // Causal with the first 5 keys masked: queries 0..4 see no key.
  const Tensor q = random_tensor({1, 1, 20, 4}, 1), k = random_tensor({1, 1, 20, 4}, 2),
               v = random_tensor({1, 1, 20, 3}, 3);
  std::vector<uint8_t> mask(20, 1);
  for (int j = 0; j < 5; ++j) mask[j] = 0;
  AttentionOptions o;
  o.causal = true;
  o.key_mask = KeyMaskView::contiguous(mask.data(), 1, 20);
  AttentionStats stats;
  const Tensor y = favor_attention(q, k, v, Projection::draw(16, 4), o, &stats);
  EXPECT_EQ(stats.zero_rows, 5);
  EXPECT_EQ(y.at(0, 0, 4, 0), 0.0f);
  EXPECT_NE(y.at(0, 0, 5, 0), 0.0f);
}

TEST(FavorAttention, CausalRowEqualsPrefixAttention) {
  // Row i of causal attention equals the last row of bidirectional attention over the
  // prefix 0..i (naive per-prefix computation in double).
  const int64_t n = 140;  // crosses two chunk boundaries
  const Tensor q = random_tensor({1, 1, n, 12}, 21, 1.0), k = random_tensor({1, 1, n, 12}, 22, 1.0),
               v = random_tensor({1, 1, n, 5}, 23);
  const Projection w = Projection::draw(48, 12, {ProjectionKind::orthogonal, NormMode::chi, 5});
  AttentionOptions causal;
  causal.causal = true;
  const Tensor y = favor_attention(q, k, v, w, causal);
  double worst = 0.0;
  for (int64_t i : {int64_t(0), int64_t(1), int64_t(63), int64_t(64), int64_t(65), int64_t(127),
                    int64_t(128), n - 1}) {
    const auto prefix = [&](const Tensor& t) {
      return TensorView{t.data(), {1, 1, i + 1, t.shape()[3]}, contiguous_strides(t.shape())};
    };
    const auto ref =
        reference::favor_attention(prefix(q), prefix(k), prefix(v), w, AttentionOptions{});
    for (int64_t x = 0; x < 5; ++x) {
      const double e = ref.at(0, 0, i, x);
      worst = std::max(worst, std::abs(y.at(0, 0, i, x) - e) / std::max(std::abs(e), 0.05));
    }
  }
  // A prefix-row is a ratio of sums of <= 140 positive terms with F = 48 products each:
  // float32 rounding stays below (140 + 48) * 2^-24 ~ 1.1e-5 relative; allow 2e-5.
  EXPECT_LE(worst, 2e-5);
}

TEST(FavorAttention, ApproachesExactAttentionAsMGrows) {
  // The relative error of FAVOR+ against exact attention falls like 1/sqrt(m) (its
  // variance like 1/m, math.md s.4). Averaged over 6 seeds, m = 64 -> 4096 (64x) should
  // cut the error ~8x; require a ratio in [4, 16]: faster or slower decay would mean a
  // bias or a broken estimator.
  const Tensor q = random_tensor({1, 2, 64, 16}, 31, 2.0),
               k = random_tensor({1, 2, 96, 16}, 32, 2.0), v = random_tensor({1, 2, 96, 8}, 33);
  const auto exact = reference::exact_attention(q, k, v, {});
  double err_small = 0.0, err_large = 0.0;
  for (uint64_t seed = 0; seed < 6; ++seed) {
    err_small += rel_error(
        favor_attention(q, k, v,
                        Projection::draw(64, 16, {ProjectionKind::iid, NormMode::chi, seed})),
        exact.values);
    err_large += rel_error(
        favor_attention(q, k, v,
                        Projection::draw(4096, 16, {ProjectionKind::iid, NormMode::chi, seed})),
        exact.values);
  }
  err_small /= 6;
  err_large /= 6;
  EXPECT_GE(err_small / err_large, 4.0) << err_small << " -> " << err_large;
  EXPECT_LE(err_small / err_large, 16.0) << err_small << " -> " << err_large;
}

// ---- exact attention ----

struct ExactCase {
  int64_t B, H, Nq, Nk, D, Dv;
  bool causal, masked;
  Accumulation acc;
};

class ExactVsNaive : public ::testing::TestWithParam<ExactCase> {};

TEST_P(ExactVsNaive, MatchesNaiveDoubleSoftmax) {
  const ExactCase c = GetParam();
  const Tensor q = random_tensor({c.B, c.H, c.Nq, c.D}, 41, 3.0);
  const Tensor k = random_tensor({c.B, c.H, c.Nk, c.D}, 42, 3.0);
  const Tensor v = random_tensor({c.B, c.H, c.Nk, c.Dv}, 43);
  std::vector<uint8_t> mask(static_cast<size_t>(c.B * c.Nk), 1);
  ExactOptions o;
  o.causal = c.causal;
  o.accumulation = c.acc;
  if (c.masked) {
    mask = testing::periodic_mask(mask.size(), 4, 2);
    o.key_mask = KeyMaskView::contiguous(mask.data(), c.B, c.Nk);
  }
  const Tensor y = exact_attention(q, k, v, o);
  const auto ref = reference::exact_attention(q, k, v, o);
  // f64: only the order of double sums differs; the float32 output rounding (2^-24 ~ 6e-8)
  // dominates. f32: scores carry ~D*2^-24 relative error times |s| <= 9 (norms 3 and
  // scale 1/sqrt(D)), and sums over Nk keys add sqrt(Nk)*2^-24: below 1e-5 here.
  const double bound = c.acc == Accumulation::f64 ? 1.2e-7 : 1e-5;
  EXPECT_LE(rel_error(y, ref.values), bound);
}

INSTANTIATE_TEST_SUITE_P(
    Exact, ExactVsNaive,
    ::testing::Values(ExactCase{2, 3, 70, 300, 16, 12, false, false, Accumulation::f32},
                      ExactCase{2, 3, 70, 300, 16, 12, false, false, Accumulation::f64},
                      ExactCase{1, 2, 300, 300, 9, 5, true, false, Accumulation::f32},
                      ExactCase{1, 2, 300, 300, 9, 5, true, true, Accumulation::f64},
                      ExactCase{2, 1, 65, 257, 4, 3, false, true, Accumulation::f32},
                      ExactCase{1, 1, 1, 1, 1, 1, false, false, Accumulation::f32},
                      ExactCase{1, 1, 1, 1, 1, 1, true, false, Accumulation::f64}));

}  // namespace
}  // namespace favor
