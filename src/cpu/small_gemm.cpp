// Highway compiles this file once per SIMD target (foreach_target) and dispatches to the best
// one the CPU supports (and FAVOR_CPU allows: cpu/isa_cap.cpp), as cpu/vec_math.cpp.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/small_gemm.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <cstdint>

HWY_BEFORE_NAMESPACE();
namespace favor::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

// Rows of op(A) per block. A block's accumulators are rows x 2 vectors; with B's two vectors
// and the broadcast they fill 15 of AVX2's (and SSE4's) 16 registers at 6 rows, 19 of
// AVX-512's 32 at 8.
#if HWY_TARGET <= HWY_AVX3
constexpr int kRows = 8;
#else
constexpr int kRows = 6;
#endif

// C's block of MR rows and NV vectors of columns at c, from op(A)'s rows at a (row r, column
// k: a[k * lda + r] transposed, else a[r * lda + k]) and B's columns at b (row k at b + k ldb).
template <int MR, int NV, bool TA>
HWY_INLINE void Block(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t K,
                      float alpha, float beta, float* c, int64_t ldc) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  using V = hn::Vec<DF>;
  V acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = hn::Zero(d);
  for (int64_t k = 0; k < K; ++k) {
    V bk[NV];
    for (int v = 0; v < NV; ++v) bk[v] = hn::LoadU(d, b + k * ldb + v * lanes);
    for (int r = 0; r < MR; ++r) {
      const V x = hn::Set(d, TA ? a[k * lda + r] : a[r * lda + k]);
      for (int v = 0; v < NV; ++v) acc[r][v] = hn::MulAdd(x, bk[v], acc[r][v]);
    }
  }
  const V va = hn::Set(d, alpha);
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) {
      float* out = c + r * ldc + v * lanes;
      V y = hn::Mul(va, acc[r][v]);
      if (beta != 0.0f) y = hn::MulAdd(hn::Set(d, beta), hn::LoadU(d, out), y);
      hn::StoreU(y, d, out);
    }
}

// The last rest < kRows rows: the block of that height.
template <int MR, int NV, bool TA>
HWY_INLINE void LastRows(int64_t rest, const float* a, int64_t lda, const float* b, int64_t ldb,
                         int64_t K, float alpha, float beta, float* c, int64_t ldc) {
  if constexpr (MR > 0) {
    if (rest == MR)
      Block<MR, NV, TA>(a, lda, b, ldb, K, alpha, beta, c, ldc);
    else
      LastRows<MR - 1, NV, TA>(rest, a, lda, b, ldb, K, alpha, beta, c, ldc);
  }
}

// All M rows for the NV vectors of columns at b, c.
template <int NV, bool TA>
HWY_INLINE void Rows(int64_t M, const float* a, int64_t lda, const float* b, int64_t ldb, int64_t K,
                     float alpha, float beta, float* c, int64_t ldc) {
  const int64_t step = TA ? 1 : lda;  // from one row of op(A) to the next
  int64_t i = 0;
  for (; i + kRows <= M; i += kRows)
    Block<kRows, NV, TA>(a + i * step, lda, b, ldb, K, alpha, beta, c + i * ldc, ldc);
  LastRows<kRows - 1, NV, TA>(M - i, a + i * step, lda, b, ldb, K, alpha, beta, c + i * ldc, ldc);
}

template <bool TA>
void Product(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
             const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t j = 0;
  for (; j + 2 * lanes <= N; j += 2 * lanes)
    Rows<2, TA>(M, A, lda, B + j, ldb, K, alpha, beta, C + j, ldc);
  if (j + lanes <= N) {
    Rows<1, TA>(M, A, lda, B + j, ldb, K, alpha, beta, C + j, ldc);
    j += lanes;
  }
  // the last N - j < lanes columns (a tile at the sequence's end, an odd feature count)
  for (int64_t i = 0; i < M; ++i)
    for (int64_t col = j; col < N; ++col) {
      float s = 0.0f;
      for (int64_t k = 0; k < K; ++k)
        s += (TA ? A[k * lda + i] : A[i * lda + k]) * B[k * ldb + col];
      float& out = C[i * ldc + col];
      out = beta != 0.0f ? alpha * s + beta * out : alpha * s;
    }
}

// dst [cols][rows] (ldd) = src [rows][cols] (lds), in square blocks of L = 8 (4 on 128-bit
// targets) moved through registers: the rows interleaved in pairs, then in pairs of pairs
// (64-bit lanes) and, at 8, in 128-bit halves; the edges element by element.
void SmallTranspose(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst,
                    int64_t ldd) {
  int64_t r0 = 0;
#if HWY_TARGET != HWY_SCALAR
  using DC = hn::CappedTag<float, 8>;
  const DC d;
  constexpr size_t L = hn::MaxLanes(DC());
  if constexpr (L == 4 || L == 8) {
    const hn::Repartition<uint64_t, DC> d64;
    const auto pairs = [&](auto a, auto b, bool upper) {  // 64-bit lanes of a and b interleaved
      const auto x = hn::BitCast(d64, a), y = hn::BitCast(d64, b);
      return hn::BitCast(d,
                         upper ? hn::InterleaveUpper(d64, x, y) : hn::InterleaveLower(d64, x, y));
    };
    for (; r0 + int64_t(L) <= rows; r0 += L) {
      int64_t c0 = 0;
      for (; c0 + int64_t(L) <= cols; c0 += L) {
        hn::Vec<DC> v[L], t[L];
        for (size_t r = 0; r < L; ++r) v[r] = hn::LoadU(d, src + (r0 + r) * lds + c0);
        for (size_t r = 0; r < L; r += 2) {
          t[r] = hn::InterleaveLower(d, v[r], v[r + 1]);
          t[r + 1] = hn::InterleaveUpper(d, v[r], v[r + 1]);
        }
        // per 128-bit block of rows r..r+3: columns 4j+0..3 of those rows, one per vector
        for (size_t r = 0; r < L; r += 4) {
          v[r] = pairs(t[r], t[r + 2], false);
          v[r + 1] = pairs(t[r], t[r + 2], true);
          v[r + 2] = pairs(t[r + 1], t[r + 3], false);
          v[r + 3] = pairs(t[r + 1], t[r + 3], true);
        }
        if constexpr (L == 4) {
          for (size_t c = 0; c < L; ++c) hn::StoreU(v[c], d, dst + (c0 + c) * ldd + r0);
        } else {
          for (size_t c = 0; c < 4; ++c) {
            hn::StoreU(hn::ConcatLowerLower(d, v[c + 4], v[c]), d, dst + (c0 + c) * ldd + r0);
            hn::StoreU(hn::ConcatUpperUpper(d, v[c + 4], v[c]), d, dst + (c0 + c + 4) * ldd + r0);
          }
        }
      }
      for (int64_t c = c0; c < cols; ++c)
        for (int64_t r = r0; r < r0 + int64_t(L); ++r) dst[c * ldd + r] = src[r * lds + c];
    }
  }
#endif
  for (int64_t r = r0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * ldd + r] = src[r * lds + c];
}

void SmallGemm(bool trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
               int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (trans_a)
    Product<true>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else
    Product<false>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace favor::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "cpu/small_gemm.hpp"

namespace favor::cpu {

HWY_EXPORT(SmallGemm);
HWY_EXPORT(SmallTranspose);

void small_gemm(bool trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  HWY_DYNAMIC_DISPATCH(SmallGemm)(trans_a, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void small_transpose(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst,
                     int64_t ldd) {
  if (rows <= 0 || cols <= 0) return;
  HWY_DYNAMIC_DISPATCH(SmallTranspose)(src, lds, rows, cols, dst, ldd);
}

}  // namespace favor::cpu
#endif  // HWY_ONCE
