#pragma once
// Code assignment of Transformer-VQ: squared distances to every code from one GEMM
// (|C_s|^2 - 2 x.C_s, the |x|^2 term is common to a row), then the nearest code (hard VQ)
// or log p(s|x) = log softmax_s(-|x - C_s|^2 / tau) (soft VQ). Shared by the attention
// kernels, the decoder and codebook learning.
#include <cstdint>
#include <vector>

#include "cpu/vq_params.hpp"

namespace favor::cpu {

/// |C_s|^2 for the c codes of one codebook (c x d, row-major), in float.
std::vector<float> code_norms(const float* codebook, int64_t codes, int64_t d);

/// |C_s|^2 of every codebook of an attention call ([Hc][c]), computed once before the
/// parallel region.
std::vector<float> all_code_norms(const VQParams& p);

/// Nearest code of each of n rows x (n x d, row stride ldx): z[r], and |x_r - C_z|^2 in
/// dist2[r] when not null (computed directly, not from the GEMM). scratch holds n x c floats.
/// Ties go to the lowest index.
void nearest_codes(const float* x, int64_t ldx, int64_t n, int64_t d, const float* codebook,
                   const float* norms, int64_t codes, int32_t* z, float* dist2, float* scratch);

/// log p(s | x_r) for n rows x (n x d, row stride ldx) into logp (n x c, row-major).
void soft_log_assign(const float* x, int64_t ldx, int64_t n, int64_t d, const float* codebook,
                     const float* norms, int64_t codes, float tau, float* logp);

/// Assigns n contiguous rows x (n x d): hard VQ (tau = 0), the nearest code z[r] (p is
/// scratch, n x c); soft VQ, p(s | x_r) into p (n x c, row-major), z unused.
void assign_rows(const float* x, int64_t n, int64_t d, const float* codebook, const float* norms,
                 int64_t codes, float tau, int32_t* z, float* p);

}  // namespace favor::cpu
