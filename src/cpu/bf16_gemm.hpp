#pragma once
// bf16 GEMM with fp32 accumulation, for the bf16 forward path (AttentionOptions::precision).
// Runs on CPUs with AVX512-BF16 (vdpbf16ps) through oneDNN's dnnl_gemm_bf16bf16f32, which
// JITs AVX512_CORE_BF16 kernels; Debian's OpenBLAS has no sbgemm. Detected at run time:
// bf16_supported() is false without the CPU flag, in a build without oneDNN, or with the
// environment variable FAVOR_NO_BF16 set to anything but "" or "0" (read at every call).
#include <cstdint>

namespace favor::cpu {

/// A bf16 number's bits (the upper half of a float32).
using bf16_t = uint16_t;

/// True when the bf16 path can run here (see above); the CPU and library checks (and a
/// one-off 2 x 2 self-test of the GEMM) run once.
bool bf16_supported();
/// Why or why not, for describe(): "avx512-bf16 (onednn X.Y.Z)", "off (no avx512-bf16)", ...
const char* bf16_status();

/// dst[i] = src[i] rounded to the nearest bf16 (ties to even). Only when bf16_supported().
void to_bf16(const float* src, bf16_t* dst, int64_t n);

/// C[M x N] = op(A) op(B) + beta * C, row-major, bf16 A and B, fp32 C and accumulation.
/// Runs on the calling thread inside favor's parallel regions (blas_on_calling_thread).
/// Only when bf16_supported().
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const bf16_t* A,
               int64_t lda, const bf16_t* B, int64_t ldb, float beta, float* C, int64_t ldc);

/// out[r * out_stride] = sum_f a[r, f] x[f] for `rows` bf16 rows of n (ld n), fp32 x and
/// accumulation. Only when bf16_supported().
void dot_rows_bf16(const bf16_t* a, int64_t rows, int64_t n, const float* x, float* out,
                   int64_t out_stride);

}  // namespace favor::cpu
