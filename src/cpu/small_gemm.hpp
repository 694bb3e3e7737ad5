#pragma once
// Products of the small, cache-resident matrices the band kernel multiplies per tile (a tile
// of 32 queries against its window keys: at most a few hundred rows, K up to the window's span),
// in registers without packing: row blocks of op(A) broadcast against two vectors of B's row,
// the accumulators kept in registers over the whole K. OpenBLAS packs both operands on every
// call, which at these sizes costs as much as the product (docs/performance.md, "The band's
// products").
#include <cstdint>

namespace favor::cpu {

/// C[M x N] = alpha op(A) B + beta C, row-major; op(A) = A [M x K] (lda) or, trans_a, the
/// transpose of A [K x M] (lda). B is [K x N] (ldb). beta = 0 does not read C (it may hold
/// anything, NaN included), as BLAS.
void small_gemm(bool trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

/// dst [cols x rows] (row stride ldd) = the transpose of src [rows x cols] (row stride lds).
void small_transpose(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst,
                     int64_t ldd);

}  // namespace favor::cpu
