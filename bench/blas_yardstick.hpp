#pragma once
// The yardstick of favor's rates: an n x n x n sgemm through the BLAS favor links, on the
// BLAS's own threads (favor bench, favor demo, bench/google_bench.cpp). libfavor keeps the BLAS
// on the calling thread (src/cpu/blas.cpp); BlasThreads lends it `n` threads for a scope.
#include <favor_openblas.h>  // the linked OpenBLAS (cmake/FindFavorBLAS.cmake)

#include <cstdint>

namespace favor::bench {

class BlasThreads {
 public:
  explicit BlasThreads(int n) { FAVOR_OPENBLAS(openblas_set_num_threads)(n); }
  ~BlasThreads() { FAVOR_OPENBLAS(openblas_set_num_threads)(1); }
  BlasThreads(const BlasThreads&) = delete;
  BlasThreads& operator=(const BlasThreads&) = delete;
};

/// C = A B for row-major n x n matrices.
inline void sgemm_square(int64_t n, const float* A, const float* B, float* C) {
  const int k = static_cast<int>(n);
  FAVOR_OPENBLAS(cblas_sgemm)
  (CblasRowMajor, CblasNoTrans, CblasNoTrans, k, k, k, 1.0f, A, k, B, k, 0.0f, C, k);
}

/// The BLAS's description: version, build, the kernel it chose ("... SkylakeX ...").
inline const char* blas_config() {
  return FAVOR_OPENBLAS(openblas_get_config)();
}

}  // namespace favor::bench
