#include "cpu/bf16_gemm.hpp"

#include "cpu/isa_cap.hpp"

#include <cstdlib>
#include <cstring>
#include <string>

#ifdef FAVOR_HAVE_DNNL
#include <immintrin.h>
#include <oneapi/dnnl/dnnl.h>

// Exported by libdnnl (2.x) but declared only in its internal headers: row-major like
// dnnl_sgemm, bf16 A and B (dnnl::impl::bfloat16_t, 16 bits), fp32 C.
extern "C" dnnl_status_t dnnl_gemm_bf16bf16f32(char transa, char transb, dnnl_dim_t M, dnnl_dim_t N,
                                               dnnl_dim_t K, float alpha, const uint16_t* A,
                                               dnnl_dim_t lda, const uint16_t* B, dnnl_dim_t ldb,
                                               float beta, float* C, dnnl_dim_t ldc);
#endif

namespace favor::cpu {
namespace {

bool forced_off() {
  const char* env = std::getenv("FAVOR_NO_BF16");
  return env != nullptr && env[0] != '\0' && std::strcmp(env, "0") != 0;
}

bf16_t round_scalar(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even (inputs are finite)
  return static_cast<bf16_t>(u >> 16);
}

float from_bf16(bf16_t b) {
  const uint32_t u = uint32_t{b} << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

#ifdef FAVOR_HAVE_DNNL
// The library's answer, once: CPU flag, then a 2 x 2 product checked against its exact value.
struct Probe {
  bool ok = false;
  std::string status;
  Probe() {
    if (!__builtin_cpu_supports("avx512bf16")) {
      status = "off (no avx512-bf16)";
      return;
    }
    const dnnl_version_t* v = dnnl_version();
    const std::string lib = "onednn " + std::to_string(v->major) + "." + std::to_string(v->minor) +
                            "." + std::to_string(v->patch);
    const float a[4] = {1.0f, 2.0f, 3.0f, 4.0f}, b[4] = {0.5f, -1.0f, 2.0f, 0.25f};
    bf16_t ab[4], bb[4];
    for (int i = 0; i < 4; ++i) ab[i] = round_scalar(a[i]), bb[i] = round_scalar(b[i]);
    float c[4] = {};
    const bool ran =
        dnnl_gemm_bf16bf16f32('N', 'N', 2, 2, 2, 1.0f, ab, 2, bb, 2, 0.0f, c, 2) == dnnl_success;
    ok = ran && c[0] == 4.5f && c[1] == -0.5f && c[2] == 9.5f && c[3] == -2.0f;
    status = ok ? "avx512-bf16 (" + lib + ")" : "off (" + lib + " bf16 gemm self-test failed)";
  }
};
const Probe& probe() {
  static const Probe p;
  return p;
}
#endif

}  // namespace

bool bf16_supported() {
  if (forced_off() || isa_cap().bf16_off) return false;
#ifdef FAVOR_HAVE_DNNL
  return probe().ok;
#else
  return false;
#endif
}

const char* bf16_status() {
  if (forced_off()) return "off (FAVOR_NO_BF16)";
  if (isa_cap().bf16_off) return "off (FAVOR_CPU)";
#ifdef FAVOR_HAVE_DNNL
  return probe().status.c_str();
#else
  return "off (built without oneDNN)";
#endif
}

#ifdef FAVOR_HAVE_DNNL
__attribute__((target("avx512f,avx512bw,avx512bf16"))) void to_bf16(const float* src, bf16_t* dst,
                                                                    int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 lo = _mm512_loadu_ps(src + i), hi = _mm512_loadu_ps(src + i + 16);
    _mm512_storeu_si512(dst + i, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
  }
  for (; i < n; ++i) dst[i] = round_scalar(src[i]);
}

__attribute__((target("avx512f,avx512bw"))) void dot_rows_bf16(const bf16_t* a, int64_t rows,
                                                               int64_t n, const float* x,
                                                               float* out, int64_t out_stride) {
  for (int64_t r = 0; r < rows; ++r) {
    const bf16_t* row = a + r * n;
    __m512 acc = _mm512_setzero_ps();
    int64_t f = 0;
    for (; f + 16 <= n; f += 16) {  // bf16 -> fp32: the bits shifted into the upper half
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + f));
      const __m512 v = _mm512_castsi512_ps(
          _mm512_maskz_slli_epi32(0xffff, _mm512_maskz_cvtepu16_epi32(0xffff, h), 16));
      acc = _mm512_fmadd_ps(v, _mm512_loadu_ps(x + f), acc);
    }
    alignas(64) float lanes[16];  // (not _mm512_reduce_add_ps: GCC 12 warns inside it)
    _mm512_store_ps(lanes, acc);
    float sum = 0.0f;
    for (float lane : lanes) sum += lane;
    for (; f < n; ++f) sum += from_bf16(row[f]) * x[f];
    out[r * out_stride] = sum;
  }
}

void gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const bf16_t* A, int64_t lda,
               const bf16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  // Arguments are the kernel's own (valid by construction), and the probe ran the library.
  dnnl_gemm_bf16bf16f32(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, 1.0f, A, lda, B, ldb, beta, C,
                        ldc);
}
#else
void to_bf16(const float* src, bf16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = round_scalar(src[i]);
}

void dot_rows_bf16(const bf16_t* a, int64_t rows, int64_t n, const float* x, float* out,
                   int64_t out_stride) {
  for (int64_t r = 0; r < rows; ++r) {
    float sum = 0.0f;
    for (int64_t f = 0; f < n; ++f) sum += from_bf16(a[r * n + f]) * x[f];
    out[r * out_stride] = sum;
  }
}

void gemm_bf16(bool, bool, int64_t, int64_t, int64_t, const bf16_t*, int64_t, const bf16_t*,
               int64_t, float, float*, int64_t) {}  // unreachable: bf16_supported() is false
#endif

}  // namespace favor::cpu
