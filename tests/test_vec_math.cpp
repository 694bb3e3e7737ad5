// The decoder's row kernels (cpu/vec_math.hpp) at every column count around the SIMD width:
// transposed_matvec against a double sum within the float summation bound, and
// update_and_read bit for bit against rank1_update then transposed_matvec (its contract,
// which the fused decoder steps rely on for outputs equal to append then query). The causal
// chunk's query shift from the prefix normalisers themselves (max_of_signed_sum_log,
// exp_shift_live_sums) gives the bits of the route through their logs (log_or_neg_inf, then
// max_of_signed_sum and exp_shift_live): lengths around the vector width and past the bound
// buffer (1024), dead sums (0, denormals), FLT_MIN, huge and infinite sums, both signs, terms
// that tie within the bound's slack.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cpu/vec_math.hpp"

namespace favor::testing {
namespace {

std::vector<float> uniform(int64_t n, float lo, float hi, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = u(rng);
  return x;
}

const int64_t kRows[] = {1, 7, 256};
const int64_t kCols[] = {1, 3, 15, 16, 17, 31, 33, 64, 65, 79, 129, 256, 257};

TEST(VecMath, TransposedMatvecIsTheSumOverRowsWithinTheFloatBound) {
  for (int64_t F : kRows) {
    for (int64_t dv : kCols) {
      const auto S = uniform(F * dv, -1.0f, 1.0f, unsigned(F * 1000 + dv));
      const auto phi = uniform(F, 0.0f, 2.0f, unsigned(F + dv));
      std::vector<float> y(static_cast<size_t>(dv), NAN);  // every column is written
      cpu::transposed_matvec(S.data(), phi.data(), F, dv, y.data());
      const double u = std::ldexp(1.0, -24), gamma = double(F) * u / (1.0 - double(F) * u);
      for (int64_t x = 0; x < dv; ++x) {
        double exact = 0.0, magnitude = 0.0;
        for (int64_t f = 0; f < F; ++f) {
          exact += double(phi[f]) * double(S[f * dv + x]);
          magnitude += std::fabs(double(phi[f]) * double(S[f * dv + x]));
        }
        ASSERT_LE(std::fabs(double(y[x]) - exact), gamma * magnitude)
            << "F = " << F << ", dv = " << dv << ", column " << x;
      }
    }
  }
}

TEST(VecMath, UpdateAndReadIsRank1UpdateThenTransposedMatvecBitForBit) {
  for (int64_t F : kRows) {
    for (int64_t dv : kCols) {
      const auto S0 = uniform(F * dv, -1.0f, 1.0f, unsigned(7 * F + dv));
      const auto phi_k = uniform(F, 0.0f, 2.0f, unsigned(F + 3 * dv));
      const auto phi_q = uniform(F, 0.0f, 2.0f, unsigned(F + 5 * dv));
      const auto v = uniform(dv, -1.0f, 1.0f, unsigned(11 * dv));
      std::vector<float> S1 = S0, S2 = S0, y1(static_cast<size_t>(dv)), y2(static_cast<size_t>(dv));
      cpu::rank1_update(S1.data(), phi_k.data(), v.data(), F, dv);
      cpu::transposed_matvec(S1.data(), phi_q.data(), F, dv, y1.data());
      cpu::update_and_read(S2.data(), phi_k.data(), v.data(), phi_q.data(), F, dv, y2.data());
      ASSERT_EQ(S1, S2) << "F = " << F << ", dv = " << dv;
      ASSERT_EQ(y1, y2) << "F = " << F << ", dv = " << dv;
    }
  }
}

uint32_t bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

TEST(VecMath, MaxOfSignedSumLogIsTheLogRoute) {
  std::mt19937 rng(2027);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> kind(0, 9);
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t n : {1, 7, 15, 16, 17, 31, 33, 64, 256, 257, 1000, 1024, 1025, 1500}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> a(n), p(n), log_p(n), want(n), got(n);
      const float spread = trial % 3 == 0 ? 0.01f : (trial % 3 == 1 ? 1.0f : 30.0f);
      for (int64_t i = 0; i < n; ++i) {
        a[i] = spread * normal(rng);
        switch (kind(rng)) {
          case 0:
            p[i] = 0.0f;
            break;
          case 1:
            p[i] = FLT_MIN * 0.25f;
            break;  // denormal: dead
          case 2:
            p[i] = FLT_MIN;
            break;
          case 3:
            p[i] = 1.0f;
            break;
          default:
            p[i] = std::exp(spread * normal(rng));
        }
      }
      if (trial == 5) p[n / 2] = inf;
      if (trial == 6) p[n - 1] = 1e38f;
      if (trial == 7) std::fill(p.begin(), p.end(), 0.0f);  // all dead: -inf
      cpu::log_or_neg_inf(p.data(), log_p.data(), n);
      for (float sign : {1.0f, -1.0f}) {
        const float ref = cpu::max_of_signed_sum(a.data(), sign, log_p.data(), n);
        const float c = cpu::max_of_signed_sum_log(a.data(), sign, p.data(), n);
        EXPECT_EQ(bits(c), bits(ref))
            << "n = " << n << " trial " << trial << ": " << c << " vs " << ref;
        if (!std::isfinite(ref)) continue;
        cpu::exp_shift_live(a.data(), sign, ref, log_p.data(), want.data(), n);
        cpu::exp_shift_live_sums(a.data(), sign, ref, p.data(), got.data(), n);
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(bits(got[i]), bits(want[i])) << "n = " << n << " trial " << trial << " i " << i;
      }
    }
  }
}

// The band kernel's softmax over a tile's columns (a [cols][rows] block of scores, -inf where
// a key is not the row's): columns_max and columns_exp against the route column by column
// (exp_affine_plus over each column's rows, then a float sum per row in column order), bit for
// bit, at row counts around the vector widths (the scalar tail) and with whole rows of -inf;
// columns_score_grad against its formula, bit for bit.
TEST(VecMath, ColumnsMaxAndExpAreTheRoutePerColumnBitForBit) {
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t rows : {1, 3, 4, 7, 8, 9, 16, 17, 31, 32, 33}) {
    for (int64_t cols : {0, 1, 5, 95}) {
      auto x = uniform(cols * rows, -30.0f, 30.0f, unsigned(rows * 97 + cols));
      for (int64_t c = 0; c < cols; ++c)
        for (int64_t r = 0; r < rows; ++r)
          if ((c + 2 * r) % 5 == 0 || r == rows - 1) x[size_t(c * rows + r)] = -inf;
      std::vector<float> top(size_t(rows), -inf), want_top(size_t(rows), -inf);
      cpu::columns_max(x.data(), cols, rows, top.data());
      for (int64_t c = 0; c < cols; ++c)
        for (int64_t r = 0; r < rows; ++r)
          want_top[size_t(r)] = std::max(want_top[size_t(r)], x[size_t(c * rows + r)]);
      std::vector<float> shift(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) {
        ASSERT_EQ(bits(top[size_t(r)]), bits(want_top[size_t(r)])) << rows << " " << cols;
        shift[size_t(r)] = std::isinf(top[size_t(r)]) ? 0.0f : -top[size_t(r)];
      }
      std::vector<float> got = x, want = x, sum(size_t(rows), 0.5f), want_sum(size_t(rows), 0.5f);
      cpu::columns_exp(got.data(), cols, rows, shift.data(), sum.data());
      for (int64_t c = 0; c < cols; ++c) {
        float* w = want.data() + c * rows;
        cpu::exp_affine_plus(w, 1.0f, 0.0f, shift.data(), w, rows);
        for (int64_t r = 0; r < rows; ++r) want_sum[size_t(r)] += w[r];
      }
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(bits(got[i]), bits(want[i])) << rows << " " << cols << " i " << i;
      for (int64_t r = 0; r < rows; ++r)
        ASSERT_EQ(bits(sum[size_t(r)]), bits(want_sum[size_t(r)])) << rows << " " << cols;
      std::vector<float> again = x;  // without sums: the same values
      cpu::columns_exp(again.data(), cols, rows, shift.data(), nullptr);
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(bits(again[i]), bits(got[i])) << rows << " " << cols << " i " << i;
      // the score gradient over the weights got: scale p (dp - delta), 0 where p is 0 even
      // over NaN (what the band's product left unwritten there)
      auto dp = uniform(cols * rows, -2.0f, 2.0f, unsigned(rows + 5 * cols));
      const auto delta = uniform(rows, -1.0f, 1.0f, unsigned(rows));
      for (size_t i = 0; i < dp.size(); ++i)
        if (got[i] == 0.0f) dp[i] = NAN;
      std::vector<float> grad = dp;
      cpu::columns_score_grad(grad.data(), got.data(), cols, rows, delta.data(), 0.125f);
      for (int64_t c = 0; c < cols; ++c)
        for (int64_t r = 0; r < rows; ++r) {
          const size_t i = size_t(c * rows + r);
          const float w = got[i] == 0.0f ? 0.0f : 0.125f * got[i] * (dp[i] - delta[size_t(r)]);
          ASSERT_EQ(bits(grad[i]), bits(w)) << rows << " " << cols << " i " << i;
        }
    }
  }
}

}  // namespace
}  // namespace favor::testing
