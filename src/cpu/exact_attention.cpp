// Exact softmax attention with an online softmax over key blocks (FlashAttention's
// recurrence on the CPU): per query block, running row max mx, row sum l and accumulator
// acc; for each key block S = Q K^T (GEMM), p = exp(S - mx_new), l = l e^{mx-mx_new} + sum p,
// acc = acc e^{mx-mx_new} + p V (GEMM). Memory O(threads * block^2), never N x N.
#include "cpu/exact_attention.hpp"


#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/blas.hpp"
#include "cpu/schedule.hpp"
#include "cpu/vec_math.hpp"

namespace favor::cpu {
namespace {

// Query rows per block; key rows per block: 64 x 256 scores = 64 KiB (float) in L2.
constexpr int64_t kQueryBlock = 128;
constexpr int64_t kKeyBlock = 256;

template <class T>
struct Workspace {
  std::vector<T> q, k, v, scores, acc, mx, l;
  std::vector<char> visible;
  Workspace(int64_t d, int64_t dv)
      : q(kQueryBlock * d),
        k(kKeyBlock * d),
        v(kKeyBlock * dv),
        scores(kQueryBlock * kKeyBlock),
        acc(kQueryBlock * dv),
        mx(kQueryBlock),
        l(kQueryBlock),
        visible(kKeyBlock) {}
};

template <class T>
void gather(const float* base, int64_t stride_n, int64_t stride_d, int64_t rows, int64_t d, T mult,
            T* dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t x = 0; x < d; ++x)
      dst[r * d + x] = mult * static_cast<T>(base[r * stride_n + x * stride_d]);
}

// Row reductions and p = exp(s - mx) in place: float rows use the SIMD kernels, double
// rows (the f64 accuracy option) plain loops.
void exp_shifted(float* row, int64_t n, float mx) {
  exp_affine(row, 1.0f, -mx, row, n);
}
void exp_shifted(double* row, int64_t n, double mx) {
  for (int64_t j = 0; j < n; ++j) row[j] = std::exp(row[j] - mx);
}
float row_max(const float* row, int64_t n) {
  return max_value(row, n);
}
double row_max(const double* row, int64_t n) {
  return *std::max_element(row, row + n);
}
float row_sum(const float* row, int64_t n) {
  return sum_values(row, n);
}
double row_sum(const double* row, int64_t n) {
  double s = 0;
  for (int64_t j = 0; j < n; ++j) s += row[j];
  return s;
}

// One query block [i0, i0 + qrows) of head (b, h); returns its rows with no visible key.
template <class T>
int64_t run_block(const AttentionParams& p, bool causal, int64_t b, int64_t h, int64_t i0,
                  Workspace<T>& ws) {
  const T ninf = -std::numeric_limits<T>::infinity();
  const int64_t d = p.d, dv = p.dv;
  const int64_t qrows = std::min(kQueryBlock, p.nq - i0);
  const float* qh = p.q + b * p.q_strides[0] + h * p.q_strides[1];
  const float* kh = p.k + b * p.k_strides[0] + h * p.k_strides[1];
  const float* vh = p.v + b * p.v_strides[0] + h * p.v_strides[1];
  float* oh = p.out + b * p.out_strides[0] + h * p.out_strides[1];
  const T scale = static_cast<T>(p.map.sqrt_scale) * static_cast<T>(p.map.sqrt_scale);

  gather<T>(qh + i0 * p.q_strides[2], p.q_strides[2], p.q_strides[3], qrows, d, scale, ws.q.data());
  std::fill(ws.acc.begin(), ws.acc.end(), T(0));
  std::fill(ws.mx.begin(), ws.mx.end(), ninf);
  std::fill(ws.l.begin(), ws.l.end(), T(0));
  const int64_t key_end = causal ? i0 + qrows : p.nk;
  for (int64_t j0 = 0; j0 < key_end; j0 += kKeyBlock) {
    const int64_t krows = std::min(kKeyBlock, key_end - j0);
    gather<T>(kh + j0 * p.k_strides[2], p.k_strides[2], p.k_strides[3], krows, d, T(1),
              ws.k.data());
    gather<T>(vh + j0 * p.v_strides[2], p.v_strides[2], p.v_strides[3], krows, dv, T(1),
              ws.v.data());
    for (int64_t j = 0; j < krows; ++j) {
      ws.visible[j] =
          p.mask == nullptr || p.mask[b * p.mask_stride_b + (j0 + j) * p.mask_stride_n] != 0;
    }
    gemm(false, true, qrows, krows, d, T(1), ws.q.data(), d, ws.k.data(), d, T(0), ws.scores.data(),
         krows);
    bool block_masked = false;
    for (int64_t j = 0; j < krows; ++j) block_masked = block_masked || !ws.visible[j];
    for (int64_t i = 0; i < qrows; ++i) {
      T* row = ws.scores.data() + i * krows;
      // Causal: key j0 + j is visible to query i0 + i when j0 + j <= i0 + i.
      const int64_t limit = causal ? std::clamp<int64_t>(i0 + i - j0 + 1, 0, krows) : krows;
      std::fill(row + limit, row + krows, ninf);
      if (block_masked) {
        for (int64_t j = 0; j < limit; ++j) {
          if (!ws.visible[j]) row[j] = ninf;
        }
      }
      const T new_max = std::max(ws.mx[i], row_max(row, krows));
      if (new_max == ninf) {  // nothing visible so far: p = 0 for the whole block
        std::fill(row, row + krows, T(0));
        continue;
      }
      const T correction = std::exp(ws.mx[i] - new_max);  // exp(-inf) = 0 on the first block
      exp_shifted(row, krows, new_max);
      ws.l[i] = ws.l[i] * correction + row_sum(row, krows);
      if (correction != T(1)) {
        for (int64_t x = 0; x < dv; ++x) ws.acc[i * dv + x] *= correction;
      }
      ws.mx[i] = new_max;
    }
    gemm(false, false, qrows, dv, krows, T(1), ws.scores.data(), krows, ws.v.data(), dv, T(1),
         ws.acc.data(), dv);
  }
  int64_t empty_rows = 0;
  for (int64_t i = 0; i < qrows; ++i) {
    float* dst = oh + (i0 + i) * p.out_strides[2];
    const T l = ws.l[i];
    if (!(l > 0)) ++empty_rows;
    for (int64_t x = 0; x < dv; ++x) {
      dst[x * p.out_strides[3]] = l > 0 ? static_cast<float>(ws.acc[i * dv + x] / l) : 0.0f;
    }
  }
  return empty_rows;
}

template <class T>
int64_t run(const AttentionParams& p, bool causal, int max_threads) {
  // Work items are (head, query block) pairs, so one long head also uses every thread.
  const int64_t qblocks = (p.nq + kQueryBlock - 1) / kQueryBlock;
  const int64_t items = p.batch * p.heads * qblocks;
  const double flops = double(p.batch * p.heads) * double(p.nq) * double(p.nk) * 2.0 *
                       double(p.d + p.dv) / (causal ? 2.0 : 1.0);
  const int threads =
      static_cast<int>(std::min<int64_t>(flops < kSerialFlops ? 1 : max_threads, items));
  auto lease = lend_workspaces<Workspace<T>>(threads, p.d, p.dv);
  const Schedule plan{items, 1, items, threads};  // each item a task, dynamically spread
  return for_each_head(plan, lease.spaces(), [&](int64_t item, Workspace<T>& ws) {
    const int64_t bh = item / qblocks, i0 = (item % qblocks) * kQueryBlock;
    return run_block<T>(p, causal, bh / p.heads, bh % p.heads, i0, ws);
  });
}

}  // namespace

int64_t exact_attention_f32(const AttentionParams& p, bool causal, const Config& config) {
  return run<float>(p, causal, config.threads);
}
int64_t exact_attention_f64(const AttentionParams& p, bool causal, const Config& config) {
  return run<double>(p, causal, config.threads);
}

}  // namespace favor::cpu
