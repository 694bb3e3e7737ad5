#include "cpu/blas.hpp"

#include <cblas.h>
#include <omp.h>

namespace favor::cpu {
namespace {
CBLAS_TRANSPOSE op(bool t) {
  return t ? CblasTrans : CblasNoTrans;
}
blasint i(int64_t x) {
  return static_cast<blasint>(x);
}
}  // namespace

void blas_on_calling_thread() {
  omp_set_num_threads(1);
}

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, op(ta), op(tb), i(M), i(N), i(K), alpha, A, i(lda), B, i(ldb), beta, C,
              i(ldc));
}

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
          int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, op(ta), op(tb), i(M), i(N), i(K), alpha, A, i(lda), B, i(ldb), beta, C,
              i(ldc));
}

void gram_upper(int64_t n, int64_t k, const double* A, int64_t lda, double* C, int64_t ldc) {
  cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, i(n), i(k), 1.0, A, i(lda), 1.0, C, i(ldc));
}

}  // namespace favor::cpu
