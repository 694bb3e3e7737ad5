#pragma once
// Row-major GEMM through the BLAS. Called from inside favor's OpenMP regions: the
// OpenMP build of OpenBLAS then runs each call on the calling thread.
#include <cstdint>

namespace favor::cpu {

/// Makes BLAS calls from this thread run on this thread alone. Call at the top of every
/// parallel region of favor's kernels: it sets the calling thread's OpenMP nthreads ICV
/// to 1, which the OpenMP build of OpenBLAS reads (omp_get_max_threads) to size its team.
/// A team of one thread is not "in parallel" for OpenMP, so without this a one-thread run
/// would let every small GEMM spawn BLAS threads. The ICV belongs to the region's implicit
/// task, so the caller's setting is unchanged after the region.
void blas_on_calling_thread();

/// C[M x N] = alpha * op(A) * op(B) + beta * C; op(X) = X^T when the flag is set.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha,
          const double* A, int64_t lda, const double* B, int64_t ldb, double beta, double* C,
          int64_t ldc);

/// C[n x n] += A^T A for A k x n (row-major): the upper triangle only (C's lower part is
/// left as it was).
void gram_upper(int64_t n, int64_t k, const double* A, int64_t lda, double* C, int64_t ldc);

}  // namespace favor::cpu
