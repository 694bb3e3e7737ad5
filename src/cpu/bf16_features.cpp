#include "cpu/bf16_features.hpp"

#include <cmath>
#include <limits>

#ifdef FAVOR_HAVE_DNNL
#include <immintrin.h>
#endif

namespace favor::cpu {

#ifdef FAVOR_HAVE_DNNL
namespace {

// exp(x) = 2^n p(f), n = round(x / ln 2), f = x - n ln 2 in [-ln2/2, ln2/2] (ln 2 in two
// parts), p the degree-4 Taylor polynomial: |e^f - p(f)| <= e^0.347 0.347^5 / 5! = 5.9e-5,
// relative to e^f >= 0.707: 8.4e-5; fp32 rounding in p adds a few 2^-24. scalef gives 0
// below the float range and inf above it. (maskz forms: GCC 12 warns inside the others.)
__attribute__((target("avx512f"))) inline __m512 exp_poly(__m512 x) {
  const __m512 n = _mm512_maskz_roundscale_ps(0xffff, _mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
  f = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), f);
  __m512 p = _mm512_set1_ps(1.0f / 24.0f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(0xffff, p, n);
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) inline void store_bf16(
    bf16_t* out, __m512 v, __mmask16 lanes) {
  _mm256_mask_storeu_epi16(out, lanes, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
}

__mmask16 tail_mask(int64_t left) {
  return left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1u);
}

}  // namespace

__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void exp_to_bf16(const float* a,
                                                                                 float shift,
                                                                                 bf16_t* out,
                                                                                 int64_t n) {
  const __m512 s = _mm512_set1_ps(shift);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 lanes = tail_mask(n - i);
    const __m512 x = _mm512_add_ps(_mm512_maskz_loadu_ps(lanes, a + i), s);
    store_bf16(out + i, exp_poly(x), lanes);
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void exp_live_to_bf16(
    const float* a, float c, const float* log_s, bf16_t* out, int64_t n) {
  const __m512 shift = _mm512_set1_ps(-c);
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 lanes = tail_mask(n - i);
    const __mmask16 live =
        _mm512_mask_cmp_ps_mask(lanes, _mm512_maskz_loadu_ps(lanes, log_s + i), ninf, _CMP_GT_OQ);
    const __m512 x = _mm512_add_ps(_mm512_maskz_loadu_ps(lanes, a + i), shift);
    store_bf16(out + i, _mm512_maskz_mov_ps(live, exp_poly(x)), lanes);
  }
}
#else
void exp_to_bf16(const float*, float, bf16_t*, int64_t) {}  // unreachable without oneDNN
void exp_live_to_bf16(const float*, float, const float*, bf16_t*, int64_t) {}
#endif

}  // namespace favor::cpu
