#pragma once
// Row-major GEMM/GEMV through the BLAS. Called from inside favor's OpenMP regions: the
// OpenMP build of OpenBLAS then runs each call on the calling thread.
#include <cstdint>

namespace favor::cpu {

/// C[M x N] = alpha * op(A) * op(B) + beta * C; op(X) = X^T when the flag is set.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha,
          const double* A, int64_t lda, const double* B, int64_t ldb, double beta, double* C,
          int64_t ldc);
/// y = alpha * op(A) x + beta * y, A is rows x cols with leading dim lda.
void gemv(bool trans, int64_t rows, int64_t cols, float alpha, const float* A, int64_t lda,
          const float* x, float beta, float* y);

}  // namespace favor::cpu
