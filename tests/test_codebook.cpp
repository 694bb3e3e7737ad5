// Codebook learning (codebook.hpp): k-means++ and Lloyd iterations, the EMA step with dead-code
// reset, the quantisation error and the commitment loss, against double computations here.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <vector>

#include "cpu/vq_key_groups.hpp"
#include "cpu/vq_kmeans.hpp"
#include "test_helpers.hpp"

namespace favor {
namespace {
using testing::expect_error;
using testing::random_tensor;
using testing::ThreadCount;

constexpr double kUlp = 0x1p-24;  // float unit roundoff

// Keys [B, H, N, D] in K Gaussian blobs per head: key n of batch b belongs to blob
// (b N + n) % K, centres N(0, spread^2), spread sigma around them.
struct Blobs {
  Tensor keys;
  int64_t blobs;
  int64_t blob_of(int64_t b, int64_t n) const { return (b * keys.shape()[2] + n) % blobs; }
};

Blobs make_blobs(const Shape4& shape, int64_t blobs, double spread, double sigma, uint64_t seed) {
  const auto [B, H, N, D] = shape;
  Blobs out{Tensor(shape), blobs};
  detail::Rng rng(seed, 7);
  std::vector<double> centres(static_cast<size_t>(H * blobs * D));
  for (double& c : centres) c = spread * rng.normal();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t x = 0; x < D; ++x)
          out.keys.at(b, h, n, x) = static_cast<float>(
              centres[(h * blobs + out.blob_of(b, n)) * D + x] + sigma * rng.normal());
  return out;
}

// The nearest code in exact arithmetic (ties: lowest index); its squared distance in *d2 and
// the gap to the second nearest in *gap.
int64_t nearest(const float* x, const float* codes, int64_t c, int64_t d, double* d2 = nullptr,
                double* gap = nullptr) {
  double best = std::numeric_limits<double>::infinity(), second = best;
  int64_t arg = 0;
  for (int64_t s = 0; s < c; ++s) {
    double e = 0.0;
    for (int64_t t = 0; t < d; ++t)
      e += (double(x[t]) - codes[s * d + t]) * (x[t] - codes[s * d + t]);
    if (e < best) {
      second = best;
      best = e;
      arg = s;
    } else if (e < second) {
      second = e;
    }
  }
  if (d2) *d2 = best;
  if (gap) *gap = second - best;
  return arg;
}

std::vector<float> row_of(const Tensor& t, int64_t b, int64_t h, int64_t n) {
  std::vector<float> r(static_cast<size_t>(t.shape()[3]));
  for (int64_t x = 0; x < t.shape()[3]; ++x) r[x] = t.at(b, h, n, x);
  return r;
}

std::vector<double> run_kmeans(const Tensor& keys, int64_t codes, int64_t iterations,
                               Codebook* out = nullptr, uint64_t seed = 1, bool per_head = true,
                               const std::optional<KeyMaskView>& mask = {}) {
  std::vector<double> errors;
  KMeansOptions o;
  o.iterations = iterations;
  o.seed = seed;
  o.on_iteration = [&](int64_t i, double e) {
    EXPECT_EQ(i, static_cast<int64_t>(errors.size()));
    errors.push_back(e);
  };
  Codebook cb = Codebook::kmeans(keys, codes, o, per_head, mask);
  EXPECT_EQ(static_cast<int64_t>(errors.size()), iterations + 1);
  if (out) *out = cb;
  return errors;
}

void expect_non_increasing(const std::vector<double>& errors) {
  for (size_t i = 1; i < errors.size(); ++i)
    EXPECT_LE(errors[i], errors[i - 1]) << "iteration " << i;
}

TEST(CodebookKMeans, RecoversBlobCentresWithNonIncreasingError) {
  // 16 blobs of 32 keys, centres ~12 apart against sigma 0.1: D^2 seeding puts one code in
  // every blob, and each code ends as its blob's sample mean.
  const int64_t B = 2, H = 2, N = 256, D = 8, K = 16;
  const Blobs data = make_blobs({B, H, N, D}, K, 3.0, 0.1, 3);
  Codebook cb(1, 1, 1, {0.0f});
  const std::vector<double> errors = run_kmeans(data.keys, K, 10, &cb);
  expect_non_increasing(errors);
  double blob_error = 0.0;
  for (int64_t h = 0; h < H; ++h) {
    std::vector<double> mean(static_cast<size_t>(K * D), 0.0);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t x = 0; x < D; ++x)
          mean[data.blob_of(b, n) * D + x] += data.keys.at(b, h, n, x) / double(B * N / K);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t x = 0; x < D; ++x) {
          const double e = data.keys.at(b, h, n, x) - mean[data.blob_of(b, n) * D + x];
          blob_error += e * e / double(B * N * H);
        }
    std::set<int64_t> used;
    const float* codes = cb.values().data() + h * K * D;
    for (int64_t k = 0; k < K; ++k) {
      const std::vector<float> centre(mean.begin() + k * D, mean.begin() + (k + 1) * D);
      const int64_t s = nearest(centre.data(), codes, K, D);
      used.insert(s);
      // The code is float(mean) of the same keys (summed in another order): a few ulps.
      for (int64_t x = 0; x < D; ++x)
        EXPECT_NEAR(codes[s * D + x], mean[k * D + x], 8 * kUlp * std::abs(mean[k * D + x]) + 1e-6)
            << "head " << h << " blob " << k;
    }
    EXPECT_EQ(static_cast<int64_t>(used.size()), K) << "head " << h << ": a blob without its code";
  }
  EXPECT_NEAR(errors.back(), blob_error, 1e-5 * blob_error);
  EXPECT_NEAR(cb.quantisation_error(data.keys), errors.back(), 1e-6 * errors.back());
}

TEST(CodebookKMeans, ErrorFallsAsCodesGrow) {
  const Tensor keys = random_tensor({1, 2, 512, 8}, 5);
  double previous = std::numeric_limits<double>::infinity();
  for (int64_t codes : {4, 16, 64}) {
    Codebook cb(1, 1, 1, {0.0f});
    const std::vector<double> errors = run_kmeans(keys, codes, 15, &cb);
    expect_non_increasing(errors);
    EXPECT_LT(errors.back(), previous) << codes << " codes";
    EXPECT_LT(errors.back(), errors.front()) << codes << " codes: Lloyd did not improve the seeds";
    // The reported error is the error of the returned codebook.
    EXPECT_NEAR(cb.quantisation_error(keys), errors.back(), 1e-6 * errors.back());
    previous = errors.back();
  }
}

TEST(CodebookKMeans, DeterministicAcrossThreadsAndSeeds) {
  ThreadCount restore;
  const Tensor keys = random_tensor({2, 3, 300, 8}, 6);
  const std::vector<uint8_t> mask = testing::periodic_mask(600, 5, 2);
  const KeyMaskView m = KeyMaskView::contiguous(mask.data(), 2, 300);
  for (bool per_head : {true, false}) {
    KMeansOptions o;
    o.iterations = 8;
    o.seed = 11;
    set_num_threads(1);
    const Codebook one = Codebook::kmeans(keys, 24, o, per_head, m);
    EXPECT_EQ(one.heads(), per_head ? 3 : 1);
    EXPECT_EQ(Codebook::kmeans(keys, 24, o, per_head, m).values(), one.values());
    set_num_threads(2);
    EXPECT_EQ(Codebook::kmeans(keys, 24, o, per_head, m).values(), one.values())
        << "per_head " << per_head;
    set_num_threads(3);
    EXPECT_EQ(Codebook::kmeans(keys, 24, o, per_head, m).values(), one.values())
        << "per_head " << per_head;
    o.seed = 12;
    EXPECT_NE(Codebook::kmeans(keys, 24, o, per_head, m).values(), one.values());
  }
}

TEST(CodebookKMeans, EndsAtLloydFixedPoint) {
  // Enough iterations to converge (the error stops changing); then every code is the mean of
  // the keys nearest to it (exact assignment here, in double), pooled over heads, masked keys
  // left out.
  const int64_t B = 2, H = 2, N = 96, D = 4, c = 8;
  const Tensor keys = random_tensor({B, H, N, D}, 8);
  const std::vector<uint8_t> mask = testing::periodic_mask(B * N, 4, 1);
  const KeyMaskView m = KeyMaskView::contiguous(mask.data(), B, N);
  Codebook cb(1, 1, 1, {0.0f});
  const std::vector<double> errors = run_kmeans(keys, c, 200, &cb, 2, false, m);
  expect_non_increasing(errors);
  ASSERT_EQ(errors.back(), errors[errors.size() - 2]) << "not converged";
  std::vector<double> sums(c * D, 0.0);
  std::vector<int64_t> counts(c, 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t n = 0; n < N; ++n) {
        if (!m.at(b, n)) continue;
        const std::vector<float> k = row_of(keys, b, h, n);
        double gap = 0.0;
        const int64_t s = nearest(k.data(), cb.values().data(), c, D, nullptr, &gap);
        ASSERT_GT(gap, 1e-4) << "a tie: the GEMM assignment may differ";
        ++counts[s];
        for (int64_t x = 0; x < D; ++x) sums[s * D + x] += k[x];
      }
  for (int64_t s = 0; s < c; ++s) {
    ASSERT_GT(counts[s], 0) << "code " << s;
    for (int64_t x = 0; x < D; ++x) {
      const double mean = sums[s * D + x] / double(counts[s]);
      EXPECT_NEAR(cb.values()[s * D + x], mean, 2 * kUlp * std::abs(mean) + 1e-12) << "code " << s;
    }
  }
}

TEST(CodebookKMeans, EmptyClusterTakesFarthestKey) {
  // Two clusters at 0 and 10 on the first axis and a third code at 100 that no key is near:
  // the Lloyd step moves it to the key farthest from its code, and the error falls.
  const int64_t N = 40, D = 2, c = 3;
  Tensor keys({1, 1, N, D});
  for (int64_t n = 0; n < N; ++n) {
    keys.at(0, 0, n, 0) = (n % 2 ? 10.0f : 0.0f) + 0.01f * float(n);
    keys.at(0, 0, n, 1) = 0.0f;
  }
  const std::vector<float> start = {0, 0, 10, 0, 100, 0};
  const cpu::KeyGroups groups = cpu::gather_keys(keys, std::nullopt, false);
  cpu::KMeans km(groups, c, 2);
  km.start_from(start.data());
  const double before = km.assign();
  km.update();
  // The farthest key from its code is the last odd one (10 + 0.39 from the code at 10).
  EXPECT_EQ(km.codebook()[4], keys.at(0, 0, N - 1, 0));
  EXPECT_EQ(km.codebook()[5], 0.0f);
  const double after = km.assign();
  EXPECT_LT(after, before);
  km.update();
  EXPECT_LE(km.assign(), after);
}

TEST(CodebookKMeans, ErrorNonIncreasingForKeysFarFromTheOrigin) {
  // Keys sharing an offset of |k| ~ 4400 with a spread of 0.05: assignment through the
  // uncentred GEMM form made the error rise between iterations here (review finding).
  Tensor keys = random_tensor({1, 2, 256, 16}, 77);
  for (float& x : keys.values()) x = 1100.0f + 0.05f * x;
  const std::vector<double> errors = run_kmeans(keys, 16, 12);
  expect_non_increasing(errors);
  EXPECT_LT(errors.back(), errors.front());
}

TEST(CodebookKMeans, DuplicateKeysGiveZeroError) {
  // 4 distinct keys, 8 copies each, 6 codes: the seeding runs out of distance (D^2 = 0) and
  // empty clusters have no farther key; nothing breaks and the error is exactly 0.
  Tensor keys({1, 1, 32, 3});
  for (int64_t n = 0; n < 32; ++n)
    for (int64_t x = 0; x < 3; ++x) keys.at(0, 0, n, x) = float((n % 4) * (x + 1));
  Codebook cb(1, 1, 1, {0.0f});
  const std::vector<double> errors = run_kmeans(keys, 6, 3, &cb);
  for (double e : errors) EXPECT_EQ(e, 0.0);
  for (int64_t s = 0; s < 6; ++s) {
    double d2 = 0.0;
    const std::vector<float> code(cb.values().begin() + s * 3, cb.values().begin() + s * 3 + 3);
    nearest(code.data(), keys.data(), 32, 3, &d2);
    EXPECT_EQ(d2, 0.0) << "code " << s << " is not a key";
  }
}

// Test-owned EMA state of a codebook [heads][codes][d] starting at count 1, sum = value.
struct State {
  std::vector<float> codebook, sum, count;
  std::vector<int64_t> unused;
  int64_t heads, codes, d;
  State(std::vector<float> values, int64_t h, int64_t c, int64_t dim)
      : codebook(values),
        sum(values),
        count(h * c, 1.0f),
        unused(h * c, 0),
        heads(h),
        codes(c),
        d(dim) {}
  CodebookState view() {
    return {codebook.data(), sum.data(), count.data(), unused.data(), heads, codes, d};
  }
};

TEST(CodebookEMA, OneUpdateMatchesFormula) {
  const int64_t B = 2, H = 2, N = 40, D = 4, c = 6;
  const Tensor keys = random_tensor({B, H, N, D}, 9);
  const std::vector<uint8_t> mask = testing::periodic_mask(B * N, 3, 0);
  const KeyMaskView m = KeyMaskView::contiguous(mask.data(), B, N);
  Tensor init = random_tensor({1, H, c, D}, 10);
  for (int64_t x = 0; x < D; ++x) init.at(0, 1, c - 1, x) = 50.0f;  // gets no keys
  EMAOptions o;
  o.decay = 0.9;
  o.dead_after = 0;
  State st(init.values(), H, c, D);
  EXPECT_EQ(codebook_ema_update(st.view(), keys, o, 0, m), 0);
  for (int64_t h = 0; h < H; ++h) {
    std::vector<double> ksum(c * D, 0.0), n_s(c, 0.0);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t n = 0; n < N; ++n) {
        if (!m.at(b, n)) continue;
        const std::vector<float> k = row_of(keys, b, h, n);
        double gap = 0.0;
        const int64_t s = nearest(k.data(), init.data() + h * c * D, c, D, nullptr, &gap);
        ASSERT_GT(gap, 1e-4);
        n_s[s] += 1.0;
        for (int64_t x = 0; x < D; ++x) ksum[s * D + x] += k[x];
      }
    EXPECT_EQ(n_s[c - 1] == 0.0, h == 1);
    for (int64_t s = 0; s < c; ++s) {
      const int64_t i = h * c + s;
      const double count = 0.9 * 1.0 + 0.1 * n_s[s];
      EXPECT_NEAR(st.count[i], count, kUlp * count);
      EXPECT_EQ(st.unused[i], n_s[s] == 0.0 ? 1 : 0);
      for (int64_t x = 0; x < D; ++x) {
        const double sum = 0.9 * init.values()[i * D + x] + 0.1 * ksum[s * D + x];
        const double code = sum / std::max(count, o.eps);
        // Rounding: the stored sum once; the code once (from the unrounded sum).
        EXPECT_NEAR(st.sum[i * D + x], sum, kUlp * std::abs(sum) + 1e-12);
        EXPECT_NEAR(st.codebook[i * D + x], code, kUlp * std::abs(code) + 1e-12);
      }
    }
  }
  // The owning Codebook runs the same step.
  Codebook cb(H, c, D, init.values());
  EXPECT_EQ(cb.ema_update(keys, o, m), 0);
  EXPECT_EQ(cb.values(), st.codebook);
  EXPECT_EQ(cb.unused(), st.unused);
}

TEST(CodebookEMA, StationaryStreamConvergesToClusterMeans) {
  // The same batch every update: count_s -> n_s and sum_s -> sum of its keys geometrically
  // (factor g per update), so the codes reach the cluster means of the batch.
  const int64_t N = 64, D = 4, K = 4;
  const Blobs data = make_blobs({1, 1, N, D}, K, 4.0, 0.5, 12);
  std::vector<float> init(K * D);
  std::vector<double> mean(K * D, 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t x = 0; x < D; ++x)
      mean[data.blob_of(0, n) * D + x] += data.keys.at(0, 0, n, x) / double(N / K);
  for (int64_t i = 0; i < K * D; ++i) init[i] = static_cast<float>(mean[i] + 0.3);
  Codebook cb(1, K, D, init);
  EMAOptions o;
  o.decay = 0.9;
  for (int u = 0; u < 300; ++u) ASSERT_EQ(cb.ema_update(data.keys, o), 0);
  double scale = 0.0;
  for (double v : mean) scale = std::max(scale, std::abs(v));
  // Left after 300 updates: 0.3 * 0.9^300 ~ 5e-15; the float fixed point of
  // x <- fl(g x + (1 - g) k) lies within about ulp / (1 - g) of k, twice (sum, count).
  const double tol = 4 * kUlp / (1 - o.decay) * scale;
  for (int64_t i = 0; i < K * D; ++i) EXPECT_NEAR(cb.values()[i], mean[i], tol) << i;
}

TEST(CodebookEMA, DeadCodesAreReseededFromKeys) {
  // Blobs around 3 codes; codes 3 and 4 are far from every key, go unused, and after
  // dead_after updates restart from two distinct keys of that update, which then stay theirs.
  const int64_t N = 60, D = 3, K = 3, c = 5, dead_after = 3;
  const Blobs data = make_blobs({1, 1, N, D}, K, 5.0, 0.3, 13);
  std::vector<float> init(c * D, 1000.0f);
  for (int64_t n = 0; n < K; ++n)
    for (int64_t x = 0; x < D; ++x) init[n * D + x] = data.keys.at(0, 0, n, x);
  init[4 * D] = -1000.0f;
  Codebook cb(1, c, D, init);
  EMAOptions o;
  o.dead_after = dead_after;
  for (int64_t u = 1; u < dead_after; ++u) {
    EXPECT_EQ(cb.ema_update(data.keys, o), 0);
    EXPECT_EQ(cb.unused()[3], u);
    EXPECT_EQ(cb.unused()[4], u);
    EXPECT_EQ(cb.unused()[0], 0);
  }
  EXPECT_EQ(cb.ema_update(data.keys, o), 2);
  EXPECT_EQ(cb.unused()[3], 0);
  EXPECT_EQ(cb.unused()[4], 0);
  std::vector<int64_t> which;
  for (int64_t s : {3, 4}) {
    double d2 = 0.0;
    const std::vector<float> code(cb.values().begin() + s * D, cb.values().begin() + (s + 1) * D);
    which.push_back(nearest(code.data(), data.keys.data(), N, D, &d2));
    EXPECT_EQ(d2, 0.0) << "code " << s << " is not a key";
  }
  EXPECT_NE(which[0], which[1]) << "two dead codes took the same key";
  // The re-seeded codes sit on keys: the next update assigns them those keys.
  EXPECT_EQ(cb.ema_update(data.keys, o), 0);
  EXPECT_EQ(cb.unused()[3], 0);
  EXPECT_EQ(cb.unused()[4], 0);
}

TEST(CodebookEMA, PooledCodebookOverHeads) {
  // A single codebook (heads == 1) learns from every head's keys: its one code converges to
  // the mean over both heads (head 1 shifted by 3, so neither head's mean alone).
  const Tensor keys = random_tensor({1, 2, 32, 4}, 14);
  Tensor shifted = keys;
  for (int64_t n = 0; n < 32; ++n)
    for (int64_t x = 0; x < 4; ++x) shifted.at(0, 1, n, x) += 3.0f;
  std::vector<double> mean(4, 0.0);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t n = 0; n < 32; ++n)
      for (int64_t x = 0; x < 4; ++x) mean[x] += shifted.at(0, h, n, x) / 64.0;
  Codebook cb(1, 1, 4, {0, 0, 0, 0});
  EMAOptions o;
  o.decay = 0.5;
  for (int u = 0; u < 60; ++u) cb.ema_update(shifted, o);
  for (int64_t x = 0; x < 4; ++x) EXPECT_NEAR(cb.values()[x], mean[x], 1e-5);
}

TEST(CodebookCommitment, LossAndGradientMatchDirectComputation) {
  const int64_t B = 2, H = 2, N = 16, D = 8, c = 8;
  const double beta = 0.25;
  const Tensor codebook = random_tensor({1, H, c, D}, 15);
  // Keys near codes (0.1 noise against codes ~4 apart): no ties within the finite-difference
  // step.
  Tensor keys = random_tensor({B, H, N, D}, 16);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t x = 0; x < D; ++x)
          keys.at(b, h, n, x) = codebook.at(0, h, (n * 3 + b) % c, x) + 0.1f * keys.at(b, h, n, x);
  const std::vector<uint8_t> mask = testing::periodic_mask(B * N, 5, 4);
  const KeyMaskView m = KeyMaskView::contiguous(mask.data(), B, N);
  const Commitment got = commitment_loss(keys, codebook, beta, m);
  double count = 0.0, sum = 0.0;
  for (uint8_t f : mask) count += f ? H : 0;
  Tensor want({B, H, N, D});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t n = 0; n < N; ++n) {
        if (!m.at(b, n)) continue;
        const std::vector<float> k = row_of(keys, b, h, n);
        double gap = 0.0;
        const int64_t s = nearest(k.data(), codebook.data() + h * c * D, c, D, nullptr, &gap);
        ASSERT_GT(gap, 1.0);
        for (int64_t x = 0; x < D; ++x) {
          const double diff = double(k[x]) - codebook.at(0, h, s, x);
          sum += diff * diff;
          want.at(b, h, n, x) = static_cast<float>(2 * beta * diff / count);
        }
      }
  EXPECT_NEAR(got.loss, beta * sum / count, 2 * kUlp * beta * sum / count);
  // Masked keys have dk == 0 exactly in both; the rest: the float difference, the float
  // factor 2 beta / count and the product each round once.
  for (int64_t i = 0; i < want.numel(); ++i)
    EXPECT_NEAR(got.dk.values()[i], want.values()[i], 4 * kUlp * std::abs(want.values()[i])) << i;

  // Finite differences: the loss is quadratic in k at a fixed assignment, so the central
  // difference over the float-rounded step is exact up to the double loss's rounding.
  double worst = 0.0, largest = 0.0;
  for (int64_t i = 0; i < keys.numel(); i += 3) {
    Tensor plus = keys, minus = keys;
    plus.values()[i] += 0.01f;
    minus.values()[i] -= 0.01f;
    const double step = double(plus.values()[i]) - minus.values()[i];
    const double fd = (commitment_loss(plus, codebook, beta, m).loss -
                       commitment_loss(minus, codebook, beta, m).loss) /
                      step;
    worst = std::max(worst, std::abs(fd - got.dk.values()[i]));
    largest = std::max(largest, std::abs(double(got.dk.values()[i])));
  }
  EXPECT_LE(worst, 1e-5 * largest);
}

TEST(CodebookCommitment, SharedCodebookAndAllMasked) {
  const Tensor keys = random_tensor({1, 3, 10, 4}, 17);
  const Tensor shared = random_tensor({1, 1, 5, 4}, 18);
  const Commitment got = commitment_loss(keys, shared, 1.0);
  Codebook cb(1, 5, 4, shared.values());
  // beta = 1: the loss is the mean quantisation error.
  EXPECT_NEAR(got.loss, cb.quantisation_error(keys), 1e-6 * got.loss);
  const std::vector<uint8_t> none(10, 0);
  const Commitment masked =
      commitment_loss(keys, shared, 1.0, KeyMaskView::contiguous(none.data(), 1, 10));
  EXPECT_EQ(masked.loss, 0.0);
  for (float g : masked.dk.values()) EXPECT_EQ(g, 0.0f);
}

TEST(CodebookErrors, RefusesBadArguments) {
  const Tensor keys = random_tensor({2, 2, 10, 4}, 19);
  const std::vector<uint8_t> mask = testing::periodic_mask(20, 2, 0);
  const KeyMaskView m = KeyMaskView::contiguous(mask.data(), 2, 10);
  expect_error([&] { Codebook::kmeans(keys, 0); }, "codes: 0");
  expect_error([&] { Codebook::kmeans(keys, 21); }, "codes: 21");
  Codebook::kmeans(keys, 20);  // 2 x 10 keys per head
  expect_error([&] { Codebook::kmeans(keys, 11, {}, true, m); }, "codes: 11");
  Codebook::kmeans(keys, 20, {}, false, m);  // pooled: 2 heads x 10 unmasked keys
  expect_error(
      [&] { Codebook::kmeans(keys, 4, {}, true, KeyMaskView::contiguous(mask.data(), 2, 9)); },
      "mask: shape");
  Tensor nan_keys = keys;
  nan_keys.at(1, 1, 3, 2) = NAN;
  expect_error([&] { Codebook::kmeans(nan_keys, 4); }, "keys: element [1,1,3,2]");

  Codebook cb(2, 3, 4, std::vector<float>(24, 0.5f));
  EMAOptions o;
  for (double decay : {0.0, 1.0, -0.5, double(NAN)}) {
    o.decay = decay;
    expect_error([&] { cb.ema_update(keys, o); }, "decay");
  }
  o = {};
  o.eps = 0.0;
  expect_error([&] { cb.ema_update(keys, o); }, "eps");
  o = {};
  o.dead_after = -1;
  expect_error([&] { cb.ema_update(keys, o); }, "dead_after");
  expect_error([&] { cb.ema_update(nan_keys); }, "keys: element");
  expect_error([&] { cb.ema_update(random_tensor({1, 2, 5, 3}, 1)); }, "state.codebook: shape");
  expect_error([&] { cb.quantisation_error(random_tensor({1, 3, 5, 4}, 1)); }, "codebook: shape");

  expect_error([&] { commitment_loss(keys, random_tensor({1, 2, 3, 5}, 1)); }, "codebook: shape");
  expect_error([&] { commitment_loss(keys, random_tensor({1, 3, 3, 4}, 1)); }, "codebook: shape");
  expect_error([&] { commitment_loss(keys, random_tensor({2, 2, 3, 4}, 1)); }, "codebook: shape");
  expect_error([&] { commitment_loss(keys, random_tensor({1, 2, 3, 4}, 1), -1.0); }, "beta");
  expect_error([&] { commitment_loss(nan_keys, random_tensor({1, 2, 3, 4}, 1)); }, "keys: element");

  expect_error([] { Codebook(0, 3, 4, {}); }, "heads: 0");
  expect_error([] { Codebook(1, 3, 4, std::vector<float>(11)); }, "values: size 11");
  expect_error([] { Codebook(1, 1, 2, {1.0f, INFINITY}); }, "values: element 1");
}

}  // namespace
}  // namespace favor
