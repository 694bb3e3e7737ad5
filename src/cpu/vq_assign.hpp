#pragma once
// Code assignment of Transformer-VQ: squared distances to every code from one GEMM
// (|C_s|^2 - 2 x.C_s, the |x|^2 term is common to a row), then the nearest code (hard VQ)
// or log p(s|x) = log softmax_s(-|x - C_s|^2 / tau) (soft VQ). Shared by the attention
// kernels, the decoder and codebook learning.
//
// The GEMM form cancels: its rounding error is about eps (|x|^2 + |C|^2), which swamps the
// gaps between codes when keys and codes share a large offset (|k| ~ 400 with a spread of
// 0.05 put half the keys on a wrong code). Distances do not change under a translation, so
// keys and codes are first centred on the codes' mean (in double, rounded once): the error
// becomes eps times the squared distances from the codebook's centre.
#include <cstdint>
#include <vector>

#include "cpu/config.hpp"
#include "cpu/vq_params.hpp"

namespace favor::cpu {

/// One codebook prepared for assignment: the codes (c x d), the codes centred on their mean
/// (c x d), the centred codes' squared norms (c) and the mean (d).
struct CodeTable {
  int64_t codes = 0, d = 0;
  std::vector<float> raw, centred, norms, mean;
};

/// The table of one codebook (c x d, row-major).
CodeTable code_table(const float* codebook, int64_t codes, int64_t d);

/// The tables of every codebook of an attention call ([Hc]), built once before the
/// parallel region.
std::vector<CodeTable> all_code_tables(const VQParams& p);

/// Nearest code of each of n rows x (n x d, row stride ldx): z[r], and |x_r - C_z|^2 in
/// dist2[r] when not null (computed directly, in double). scratch holds n x c floats. Ties go
/// to the lowest index.
void nearest_codes(const float* x, int64_t ldx, int64_t n, const CodeTable& t, int32_t* z,
                   float* dist2, float* scratch);

/// log p(s | x_r) for n rows x (n x d, row stride ldx) into logp (n x c, row-major).
void soft_log_assign(const float* x, int64_t ldx, int64_t n, const CodeTable& t, float tau,
                     float* logp);

/// Assigns n contiguous rows x (n x d): hard VQ (tau = 0), the nearest code z[r] (p is
/// scratch, n x c); soft VQ, p(s | x_r) into p (n x c, row-major), z unused.
void assign_rows(const float* x, int64_t n, const CodeTable& t, float tau, int32_t* z, float* p);

/// favor::vq_assign: the nearest code of every key (cpu/vq_assign_keys.cpp).
void vq_assign_keys(const kernels::VQAssignParams& p, const Config& config);

}  // namespace favor::cpu
