// The band kernel's products (cpu/small_gemm.hpp) on every SIMD target this CPU runs, against
// a double sum: C = alpha op(A) B + beta C within the float bound gamma_(K+2) (|alpha| sum_k
// |a_ik b_kj| + |beta c_ij|) (K products summed, then the scale and the add), at extents around
// each target's row block (6 or 8) and vector widths (4, 8, 16 lanes: the 1- and 2-vector
// blocks and the scalar tail), leading dimensions past the extents, op(A) as A or A^T, and
// beta = 0 over a C of NaN (BLAS: C is not read). Nothing outside C's M x N block is written.
// small_transpose, element for element, on every target.
#include <gtest/gtest.h>

#include <hwy/highway.h>
#include <hwy/targets.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cpu/small_gemm.hpp"

namespace favor::testing {
namespace {

std::vector<float> normal(int64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g;
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = g(rng);
  return x;
}

// One product checked: C (ldc = N + 3, rows and padding filled with `fill`) against the bound.
void check(bool trans_a, int64_t M, int64_t N, int64_t K, float alpha, float beta,
           const std::string& where) {
  const int64_t lda = (trans_a ? M : K) + 2, ldb = N + 5, ldc = N + 3;
  const int64_t a_rows = trans_a ? K : M;
  const auto A = normal(std::max<int64_t>(a_rows, 1) * lda, unsigned(M * 131 + K));
  const auto B = normal(std::max<int64_t>(K, 1) * ldb, unsigned(N * 17 + K));
  auto C =
      beta == 0.0f ? std::vector<float>(size_t(M * ldc), NAN) : normal(M * ldc, unsigned(M + N));
  const std::vector<float> C0 = C;
  cpu::small_gemm(trans_a, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
  const double u = std::ldexp(1.0, -24), gamma = double(K + 2) * u / (1.0 - double(K + 2) * u);
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const float got = C[size_t(i * ldc + j)];
      if (j >= N) {  // padding: untouched (NaN stays NaN)
        const float was = C0[size_t(i * ldc + j)];
        ASSERT_TRUE(std::isnan(was) ? std::isnan(got) : got == was)
            << where << " wrote (" << i << ", " << j << ")";
        continue;
      }
      double exact = 0.0, magnitude = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double a = trans_a ? A[size_t(k * lda + i)] : A[size_t(i * lda + k)];
        exact += a * double(B[size_t(k * ldb + j)]);
        magnitude += std::fabs(a * double(B[size_t(k * ldb + j)]));
      }
      exact *= alpha;
      magnitude *= std::fabs(alpha);
      if (beta != 0.0f) {
        exact += double(beta) * double(C0[size_t(i * ldc + j)]);
        magnitude += std::fabs(double(beta) * double(C0[size_t(i * ldc + j)]));
      }
      ASSERT_FALSE(std::isnan(got)) << where << " (" << i << ", " << j << ")";
      ASSERT_LE(std::fabs(double(got) - exact), gamma * magnitude)
          << where << " (" << i << ", " << j << ")";
    }
  }
}

// Back to the CPU's own targets when the test ends, failed or not.
struct ChosenTargetsRestored {
  ~ChosenTargetsRestored() {
    hwy::SetSupportedTargetsForTest(0);
    hwy::GetChosenTarget().Update(hwy::SupportedTargets());
  }
};

// body(target) once per SIMD target this CPU runs, each chosen in turn, until a fatal
// failure; returns how many ran.
template <class Body>
int on_every_target(Body body) {
  const ChosenTargetsRestored restore;
  int targets = 0;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    hwy::GetChosenTarget().Update(hwy::SupportedTargets());
    ++targets;
    body(target);
    if (::testing::Test::HasFatalFailure()) break;
  }
  return targets;
}

TEST(SmallGemm, IsTheProductWithinTheFloatBoundOnEverySimdTarget) {
  const int64_t rows[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 32, 95};  // every tail of 6, 8
  const int64_t cols[] = {1, 3, 4, 5, 8, 9, 15, 16, 17, 31, 32, 33, 48, 64, 65};
  const int64_t depths[] = {0, 1, 7, 64, 95};
  const float scales[][2] = {{1.0f, 0.0f}, {0.5f, 1.0f}, {-1.25f, -0.25f}};
  const int targets = on_every_target([&](int64_t target) {
    for (bool trans_a : {false, true})
      for (int64_t M : rows)
        for (int64_t N : cols)
          for (int64_t K : depths)
            for (const auto& s : scales) {
              const std::string where =
                  std::string(hwy::TargetName(target)) + (trans_a ? " A^T" : " A") + " M " +
                  std::to_string(M) + " N " + std::to_string(N) + " K " + std::to_string(K) +
                  " alpha " + std::to_string(s[0]) + " beta " + std::to_string(s[1]);
              check(trans_a, M, N, K, s[0], s[1], where);
              if (HasFatalFailure()) return;
            }
  });
  EXPECT_GE(targets, 1);
}

// small_transpose on every target: each element moved exactly (the 8 x 8 and 4 x 4 register
// blocks and the element-wise edges), leading dimensions past the extents, nothing else written.
TEST(SmallGemm, TransposeMovesEveryElementOnEverySimdTarget) {
  const int64_t extents[] = {1, 3, 4, 5, 7, 8, 9, 12, 16, 17, 31, 32, 33, 64, 65};
  const int targets = on_every_target([&](int64_t target) {
    for (int64_t rows : extents)
      for (int64_t cols : extents) {
        const int64_t lds = cols + 3, ldd = rows + 2;
        const auto src = normal(rows * lds, unsigned(rows * 71 + cols));
        std::vector<float> dst(size_t(cols * ldd), NAN);
        cpu::small_transpose(src.data(), lds, rows, cols, dst.data(), ldd);
        for (int64_t c = 0; c < cols; ++c)
          for (int64_t r = 0; r < ldd; ++r) {
            const float got = dst[size_t(c * ldd + r)];
            if (r >= rows) {
              ASSERT_TRUE(std::isnan(got)) << hwy::TargetName(target) << " wrote padding";
              continue;
            }
            ASSERT_EQ(got, src[size_t(r * lds + c)])
                << hwy::TargetName(target) << " rows " << rows << " cols " << cols << " (" << r
                << ", " << c << ")";
          }
      }
  });
  EXPECT_GE(targets, 1);
}

}  // namespace
}  // namespace favor::testing
