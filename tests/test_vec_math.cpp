// The decoder's row kernels (cpu/vec_math.hpp) at every column count around the SIMD width:
// transposed_matvec against a double sum within the float summation bound, and
// update_and_read bit for bit against rank1_update then transposed_matvec (its contract,
// which the fused decoder steps rely on for outputs equal to append then query).
#include <gtest/gtest.h>

#include <cmath>
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

}  // namespace
}  // namespace favor::testing
