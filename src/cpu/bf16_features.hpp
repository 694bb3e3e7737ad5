#pragma once
// Positive features straight to bf16 for the bf16 forward (favor_bidirectional_bf16.cpp):
// exp by a degree-4 polynomial, whose relative error (<= 8.5e-5 = 2^-13.5, below the bf16
// rounding that follows, u = 2^-8) enters the bound of docs/numerics.md ("bf16 forward").
// Only when bf16_supported() (cpu/bf16_gemm.hpp).
#include <cstdint>

#include "cpu/bf16_gemm.hpp"

namespace favor::cpu {

/// Relative error bound of the polynomial exp below (Taylor remainder, fp32 arithmetic).
constexpr double kBf16ExpError = 8.5e-5;

/// out[f] = bf16(exp(a[f] + shift)): the keys' features exp(a + g - M).
void exp_to_bf16(const float* a, float shift, bf16_t* out, int64_t n);
/// out[f] = bf16(exp(a[f] - c)) where log_s[f] > -inf, else 0: the queries' (as
/// exp_shift_live of cpu/vec_math.hpp).
void exp_live_to_bf16(const float* a, float c, const float* log_s, bf16_t* out, int64_t n);

}  // namespace favor::cpu
