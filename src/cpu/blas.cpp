#include "cpu/blas.hpp"

#include <favor_openblas.h>  // FAVOR_OPENBLAS: the linked OpenBLAS's names (cmake/FindFavorBLAS.cmake)
#include <omp.h>

namespace favor::cpu {
namespace {
CBLAS_TRANSPOSE op(bool t) {
  return t ? CblasTrans : CblasNoTrans;
}
blasint i(int64_t x) {
  return static_cast<blasint>(x);
}

#if FAVOR_OPENBLAS_SCIPY
// scipy-openblas32 has its own (pthreads) thread pool, which knows nothing of favor's OpenMP
// team. favor parallelises over heads, parts and chunks itself, so the BLAS runs every call on
// the calling thread: set once, when libfavor loads, before any call.
const bool g_blas_single_threaded = [] {
  FAVOR_OPENBLAS(openblas_set_num_threads)(1);
  return true;
}();
#endif
}  // namespace

void blas_on_calling_thread() {
  omp_set_num_threads(1);
}

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  FAVOR_OPENBLAS(cblas_sgemm)
  (CblasRowMajor, op(ta), op(tb), i(M), i(N), i(K), alpha, A, i(lda), B, i(ldb), beta, C, i(ldc));
}

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
          int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  FAVOR_OPENBLAS(cblas_dgemm)
  (CblasRowMajor, op(ta), op(tb), i(M), i(N), i(K), alpha, A, i(lda), B, i(ldb), beta, C, i(ldc));
}

void gram_upper(int64_t n, int64_t k, const double* A, int64_t lda, double* C, int64_t ldc) {
  FAVOR_OPENBLAS(cblas_dsyrk)
  (CblasRowMajor, CblasUpper, CblasTrans, i(n), i(k), 1.0, A, i(lda), 1.0, C, i(ldc));
}

}  // namespace favor::cpu
