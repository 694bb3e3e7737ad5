#pragma once
// Vectorised elementwise math over float rows, dispatched at run time to the best SIMD
// target of the machine (Highway: SSE4, AVX2, AVX-512, ...). Accuracy: exp 1 ulp, log
// 4 ulp, sin/cos 3 ulp (Highway's contrib/math figures).
#include <cstdint>
#include <string>

namespace favor::cpu {

/// out[i] = exp(sign * in[i] + offset); exp(-inf) = 0. in and out may be equal.
void exp_affine(const float* in, float sign, float offset, float* out, int64_t n);
/// out[i] = log(in[i]) if in[i] >= FLT_MIN (a normal float), else -inf.
void log_or_neg_inf(const float* in, float* out, int64_t n);
/// out[i] = exp(sign * a[i] - c) where log_s[i] > -inf, else 0.
void exp_shift_live(const float* a, float sign, float c, const float* log_s, float* out, int64_t n);
/// out[i] = exp(sign * a[i] + offset + b[i]); exp(-inf) = 0. a and out may be equal.
void exp_affine_plus(const float* a, float sign, float offset, const float* b, float* out,
                     int64_t n);
/// Over the columns of x [cols][rows] (row-major), row by row: top[r] = max(top[r], x[c][r]).
void columns_max(const float* x, int64_t cols, int64_t rows, float* top);
/// x[c][r] = exp(x[c][r] + shift[r]) (exp(-inf) = 0) and, where sum is set, sum[r] += the
/// new x[c][r] in column order (float).
void columns_exp(float* x, int64_t cols, int64_t rows, const float* shift, float* sum);
/// The softmax's score gradient over [cols][rows] blocks: dp[c][r] = scale p[c][r] (dp[c][r] -
/// delta[r]), and 0 where p[c][r] is 0 (whatever dp holds there, NaN included).
void columns_score_grad(float* dp, const float* p, int64_t cols, int64_t rows, const float* delta,
                        float scale);
/// max_i (sign * a[i] + b[i]); -inf when n == 0 or every term is -inf.
float max_of_signed_sum(const float* a, float sign, const float* b, int64_t n);
/// max_of_signed_sum(a, sign, log_or_neg_inf(p)) to the bit, forming the log only where a
/// term can be the max (a cheap bound of log p rules out the others).
float max_of_signed_sum_log(const float* a, float sign, const float* p, int64_t n);
/// exp_shift_live with log_s = log_or_neg_inf(p), to the bit: exp(sign * a[i] - c) where
/// p[i] >= FLT_MIN, else 0.
void exp_shift_live_sums(const float* a, float sign, float c, const float* p, float* out,
                         int64_t n);
/// max_i a[i] and min_i a[i].
float max_value(const float* a, int64_t n);
float min_value(const float* a, int64_t n);
/// out_sin[i] = mult * sin(a[i]), out_cos[i] = mult * cos(a[i]).
void sincos_scaled(const float* a, float mult, float* out_sin, float* out_cos, int64_t n);
/// dst[i] = mult * src[i] (src contiguous); returns sum_i dst[i]^2 accumulated in double.
double scale_copy_norm2(const float* src, float mult, float* dst, int64_t n);
/// dst[i] = mult * src[i].
void scale_copy(const float* src, float mult, float* dst, int64_t n);
/// out[i] = prev[i] * f + add[i], the product rounded before the sum (no fused multiply-add).
void scale_add(const float* prev, float f, const float* add, float* out, int64_t n);
/// dst[i] = mult * src[i]; returns whether every dst[i] is finite.
bool scale_copy_finite(const float* src, float mult, float* dst, int64_t n);
/// The causal backward's key row (favor_backward_causal.cpp, sweep B), with P*[i] =
/// max(prefix[i], FLT_MIN) (1 when prefix is null): dphi[i] *= (P*[i] e) inv_sigma[i],
/// kscaled[i] = (phi[i] e) inv_sigma[i], then phi[i] *= 1 / P*[i] (prefix non-null).
void key_row_scales(const float* prefix, float e, const float* inv_sigma, float* dphi, float* phi,
                    float* kscaled, int64_t n);
/// out[i] += max(p[i], FLT_MIN) * b[i] (the product rounded before the sum).
void add_floored_product(const float* p, const float* b, float* out, int64_t n);
/// out[i] = a[i] * (b[i] * e).
void mul_scaled(const float* a, const float* b, float e, float* out, int64_t n);
/// One row of the upstream gradient (feature_grad.hpp, upstream_rows) for contiguous dy:
/// g[i] = dy[i] / den for i < dv, g[dv] = -(sum_i dy[i] y[i]) / den with y = num / den (the
/// sum in SIMD lanes); returns whether every y[i] is finite.
bool upstream_row(const float* num, float den, const float* dy, float* g, int64_t dv);
/// sum_i a[i] (float accumulation in SIMD lanes).
float sum_values(const float* a, int64_t n);
/// sum_i a[i] b[i] (float accumulation in SIMD lanes).
float dot(const float* a, const float* b, int64_t n);
/// out[r] = mult * dot(A[r, :], x) for r < rows (A is rows x n, row-major).
void row_dots(const float* A, int64_t rows, int64_t n, const float* x, float mult, float* out);
/// S[f, :] += phi[f] * v[:] for f < F (S is F x dv, row-major): a rank-1 update.
void rank1_update(float* S, const float* phi, const float* v, int64_t F, int64_t dv);
/// y[:] = sum_f phi[f] * S[f, :] (S is F x dv): y = S^T phi.
void transposed_matvec(const float* S, const float* phi, int64_t F, int64_t dv, float* y);
/// S[f, :] += phi_k[f] * vx[:], then y[:] += phi_q[f] * S[f, :], for f < F in order (S is
/// F x dv, y starts at zero): rank1_update then transposed_matvec, the same bits, with S
/// read and written once.
void update_and_read(float* S, const float* phi_k, const float* vx, const float* phi_q, int64_t F,
                     int64_t dv, float* y);

}  // namespace favor::cpu
