#pragma once
// The feature-map stage shared by every FAVOR kernel: gather a tile of rows, project it
// with one GEMM, and turn projections into stabilised features row by row.
//
// Stabilisation (docs/numerics.md): keys get phi = exp(L + g_j - M) with g_j the key's
// log weight (-|y|^2/2 for the positive family, +|y|^2/2 for trig) and M the running
// max over keys of the head; queries get phi = exp(L - c_i) with the per-row shift
// c_i = max_f (L_if + log s_f), which cancels in the row's ratio and bounds the
// denominator below by 1.
#include <cstdint>

#include "cpu/contract.hpp"
#include "favor/features.hpp"

namespace favor::cpu {

inline bool positive_family(Kernel k) {
  return k != Kernel::trig;
}
/// Kernels with features [exp(a), exp(-a)] (2m of them).
inline bool two_sided(Kernel k) {
  return k == Kernel::hyperbolic || k == Kernel::hedgehog;
}

/// dst[r, x] = mult * row_r[x] for `rows` rows starting at base (row stride stride_n,
/// element stride stride_d); half_norm2[r] = |dst_r|^2 / 2 in double (if non-null).
void gather_rows(const float* base, int64_t stride_n, int64_t stride_d, int64_t rows, int64_t d,
                 float mult, float* dst, double* half_norm2);
/// a[rows x m] = x[rows x d] * W^T (+ bias[m] on every row when bias is non-null: the
/// log bias of FAVOR++ / FAVOR#, which enters every feature like a projection would).
void project_rows(const float* x, int64_t rows, int64_t d, const float* w, int64_t m, float* a,
                  const float* bias = nullptr);
/// project_rows from W^T (wt: d x m) in pieces of at most kSmallGemm / (m d) rows, which
/// OpenBLAS runs on its small-matrix path: no packing of W per call (the causal sweeps'
/// blocks, the decoder's step). Its sums may round differently from project_rows'.
void project_rows_transposed(const float* x, int64_t rows, int64_t d, const float* wt, int64_t m,
                             float* a, const float* bias = nullptr);

/// Largest log-feature of a key row of head bh with log weight g (map.key_log_weight):
/// max_f (L_f + l_f) + g (positive family; l = log lambda^2, or 0), g + max_f l_f (trig).
double key_log_max(const FeatureParams& map, int64_t bh, const float* a_row, double g);
/// Key features of head bh, F of them, l = log lambda^2 (0 without feature weights):
/// positive exp(a + l + off); hyperbolic and hedgehog [exp(a + l + off), exp(-a + l + off)];
/// trig exp(off) lambda^2 [sin a, cos a]. off = g - M.
void key_features(const FeatureParams& map, int64_t bh, const float* a_row, double off, float* phi);
/// Query shift c = max_f (L_f + log_s_f) (positive family); 0 for trig.
float query_shift(Kernel kernel, const float* a_row, int64_t m, const float* log_s);
/// Query features: exp(L - c) (positive family) where log_s > -inf and 0 where the key
/// sum s_f underflowed (S_f and s_f are then zero, so the feature contributes nothing, and
/// exp(L - c) <= 1/s_f could overflow); [sin a, cos a] (trig, log_s unused).
void query_features(Kernel kernel, const float* a_row, int64_t m, float c, const float* log_s,
                    float* phi);

/// query_shift and query_features from the key sums s rather than their logs (log_s =
/// log_or_neg_inf(s)), the same bits: the causal chunk's prefix normalisers change every row,
/// and their logs are formed only where they can give the max (max_of_signed_sum_log).
float query_shift_sums(Kernel kernel, const float* a_row, int64_t m, const float* s);
void query_features_sums(Kernel kernel, const float* a_row, int64_t m, float c, const float* s,
                         float* phi);

/// favor::features: the exact features of every row (cpu/exact_features.cpp).
kernels::FeatureOverflow exact_features(const kernels::FeaturesParams& p);

}  // namespace favor::cpu
