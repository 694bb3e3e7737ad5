// Backward pass of exact softmax attention, blockwise (never N x N), float32:
//   1. per (head, query block): the forward with an online softmax gives y and the row
//      log-sum-exp lse_i; D_i = dy_i . y_i; then over key blocks P = exp(S - lse),
//      dP = dy V^T, dS = P (dP - D), dq = scale dS K;
//   2. per (head, key block): over query blocks, dv = P^T dy and dk = scale dS^T Q.
// lse and D (two floats per query row) are all it keeps between the phases.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/attention_params.hpp"
#include "cpu/blas.hpp"
#include "cpu/exact_attention.hpp"
#include "cpu/feature_tile.hpp"
#include "cpu/schedule.hpp"
#include "cpu/vec_math.hpp"

namespace favor::cpu {
namespace {

constexpr int64_t kBlock = 128;  // query and key rows per block: 128 x 128 scores in L1/L2
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Workspace {
  std::vector<float> q, k, v, dy, s, dp, acc, mx, l;
  std::vector<char> visible;
  Workspace(int64_t d, int64_t dv)
      : q(kBlock * d),
        k(kBlock * d),
        v(kBlock * dv),
        dy(kBlock * dv),
        s(kBlock * kBlock),
        dp(kBlock * kBlock),
        acc(kBlock * std::max(d, dv)),
        mx(kBlock),
        l(kBlock),
        visible(kBlock) {}
};

struct Rows {  // a block of rows of one head, gathered contiguous
  int64_t start, count;
};

void gather(const float* base, const Shape4& st, int64_t b, int64_t h, Rows r, int64_t width,
            float mult, float* dst) {
  gather_rows(base + b * st[0] + h * st[1] + r.start * st[2], st[2], st[3], r.count, width, mult,
              dst, nullptr);
}

// Scores S = scale Q K^T of a (query block, key block), masked (causal, key mask) to -inf.
void scores(const AttentionParams& p, bool causal, int64_t b, Rows qr, Rows kr, Workspace& ws) {
  gemm(false, true, qr.count, kr.count, p.d, 1.0f, ws.q.data(), p.d, ws.k.data(), p.d, 0.0f,
       ws.s.data(), kr.count);
  for (int64_t j = 0; j < kr.count; ++j) {
    ws.visible[j] =
        p.mask == nullptr || p.mask[b * p.mask_stride_b + (kr.start + j) * p.mask_stride_n] != 0;
  }
  for (int64_t i = 0; i < qr.count; ++i) {
    float* row = ws.s.data() + i * kr.count;
    for (int64_t j = 0; j < kr.count; ++j) {
      if (!ws.visible[j] || (causal && kr.start + j > qr.start + i)) row[j] = kNegInf;
    }
  }
}

// P = exp(S - lse) and dS = P (dP - D) in place of S (dP = dy V^T in ws.dp).
void probabilities_and_ds(Rows qr, Rows kr, const float* lse, const float* dd, Workspace& ws,
                          bool want_ds) {
  for (int64_t i = 0; i < qr.count; ++i) {
    float* row = ws.s.data() + i * kr.count;
    if (std::isinf(lse[i])) {
      std::fill(row, row + kr.count, 0.0f);
    } else {
      exp_affine(row, 1.0f, -lse[i], row, kr.count);
    }
    if (want_ds) {
      float* dp = ws.dp.data() + i * kr.count;
      for (int64_t j = 0; j < kr.count; ++j) dp[j] = row[j] * (dp[j] - dd[i]);
    }
  }
}

// Phase 1 for one (head, query block): lse, D and dq.
void query_block(const BackwardParams& bp, bool causal, int64_t b, int64_t h, Rows qr, float* lse,
                 float* dd, Workspace& ws) {
  const AttentionParams& p = bp.fwd;
  const float scale = p.map.sqrt_scale * p.map.sqrt_scale;
  const int64_t d = p.d, dv = p.dv, bh = b * p.heads + h;
  gather(p.q, p.q_strides, b, h, qr, d, scale, ws.q.data());  // scale folded into Q
  gather(bp.dy, bp.dy_strides, b, h, qr, dv, 1.0f, ws.dy.data());
  const int64_t key_end = causal ? qr.start + qr.count : p.nk;
  // Forward: running max and sum, y in acc.
  std::vector<float>& mx = ws.mx;
  std::vector<float>& l = ws.l;
  std::fill(mx.begin(), mx.end(), kNegInf);
  std::fill(l.begin(), l.end(), 0.0f);
  std::fill(ws.acc.begin(), ws.acc.begin() + qr.count * dv, 0.0f);
  for (int64_t j0 = 0; j0 < key_end; j0 += kBlock) {
    const Rows kr{j0, std::min(kBlock, key_end - j0)};
    gather(p.k, p.k_strides, b, h, kr, d, 1.0f, ws.k.data());
    gather(p.v, p.v_strides, b, h, kr, dv, 1.0f, ws.v.data());
    scores(p, causal, b, qr, kr, ws);
    for (int64_t i = 0; i < qr.count; ++i) {
      float* row = ws.s.data() + i * kr.count;
      const float new_max = std::max(mx[i], max_value(row, kr.count));
      if (std::isinf(new_max)) {
        std::fill(row, row + kr.count, 0.0f);
        continue;
      }
      const float corr = std::isinf(mx[i]) ? 0.0f : std::exp(mx[i] - new_max);
      exp_affine(row, 1.0f, -new_max, row, kr.count);
      l[i] = l[i] * corr + sum_values(row, kr.count);
      for (int64_t x = 0; x < dv; ++x) ws.acc[i * dv + x] *= corr;
      mx[i] = new_max;
    }
    gemm(false, false, qr.count, dv, kr.count, 1.0f, ws.s.data(), kr.count, ws.v.data(), dv, 1.0f,
         ws.acc.data(), dv);
  }
  for (int64_t i = 0; i < qr.count; ++i) {
    const bool empty = !(l[i] > 0.0f);
    lse[i] = empty ? kNegInf : mx[i] + std::log(l[i]);
    float dot = 0.0f;
    for (int64_t x = 0; !empty && x < dv; ++x) dot += ws.dy[i * dv + x] * ws.acc[i * dv + x] / l[i];
    dd[i] = dot;
  }
  // dq = scale dS K.
  float* dq = bp.dq + (bh * p.nq + qr.start) * d;
  for (int64_t j0 = 0; j0 < key_end; j0 += kBlock) {
    const Rows kr{j0, std::min(kBlock, key_end - j0)};
    gather(p.k, p.k_strides, b, h, kr, d, 1.0f, ws.k.data());
    gather(p.v, p.v_strides, b, h, kr, dv, 1.0f, ws.v.data());
    scores(p, causal, b, qr, kr, ws);
    gemm(false, true, qr.count, kr.count, dv, 1.0f, ws.dy.data(), dv, ws.v.data(), dv, 0.0f,
         ws.dp.data(), kr.count);
    probabilities_and_ds(qr, kr, lse, dd, ws, true);
    gemm(false, false, qr.count, d, kr.count, scale, ws.dp.data(), kr.count, ws.k.data(), d, 1.0f,
         dq, d);
  }
}

// Phase 2 for one (head, key block): dk and dv.
void key_block(const BackwardParams& bp, bool causal, int64_t b, int64_t h, Rows kr,
               const float* lse, const float* dd, Workspace& ws) {
  const AttentionParams& p = bp.fwd;
  const float scale = p.map.sqrt_scale * p.map.sqrt_scale;
  const int64_t d = p.d, dv = p.dv, bh = b * p.heads + h;
  gather(p.k, p.k_strides, b, h, kr, d, 1.0f, ws.k.data());
  gather(p.v, p.v_strides, b, h, kr, dv, 1.0f, ws.v.data());
  float* dk = bp.dk + (bh * p.nk + kr.start) * d;
  float* dvo = bp.dv + (bh * p.nk + kr.start) * dv;
  const int64_t first_query = causal ? kr.start / kBlock * kBlock : 0;
  for (int64_t i0 = first_query; i0 < p.nq; i0 += kBlock) {
    const Rows qr{i0, std::min(kBlock, p.nq - i0)};
    gather(p.q, p.q_strides, b, h, qr, d, scale, ws.q.data());
    gather(bp.dy, bp.dy_strides, b, h, qr, dv, 1.0f, ws.dy.data());
    scores(p, causal, b, qr, kr, ws);
    gemm(false, true, qr.count, kr.count, dv, 1.0f, ws.dy.data(), dv, ws.v.data(), dv, 0.0f,
         ws.dp.data(), kr.count);
    probabilities_and_ds(qr, kr, lse + i0, dd + i0, ws, true);
    gemm(true, false, kr.count, dv, qr.count, 1.0f, ws.s.data(), kr.count, ws.dy.data(), dv, 1.0f,
         dvo, dv);
    // dk = scale dS^T Q; ws.q holds scale * Q already.
    gemm(true, false, kr.count, d, qr.count, 1.0f, ws.dp.data(), kr.count, ws.q.data(), d, 1.0f, dk,
         d);
  }
}

}  // namespace

void exact_attention_backward(const BackwardParams& bp, bool causal, const Config& config) {
  const AttentionParams& p = bp.fwd;
  const int64_t heads = p.batch * p.heads;
  const int64_t qblocks = (p.nq + kBlock - 1) / kBlock, kblocks = (p.nk + kBlock - 1) / kBlock;
  const int threads =
      static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(config.threads, heads * qblocks)));
  std::vector<Workspace> spaces = make_workspaces<Workspace>(threads, p.d, p.dv);
  std::vector<float> lse(static_cast<size_t>(heads * p.nq)), dd(static_cast<size_t>(heads * p.nq));
  const int team = team_now(threads);  // one thread while contended (cpu/team.hpp)
  RegionClock clock(team);
#pragma omp parallel num_threads(team)
  {
    const int64_t arrived = clock.arrive();
    blas_on_calling_thread();
    Workspace& ws = spaces[static_cast<size_t>(omp_get_thread_num())];
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < heads * qblocks; ++item) {
      const int64_t bh = item / qblocks, i0 = (item % qblocks) * kBlock;
      query_block(bp, causal, bh / p.heads, bh % p.heads, {i0, std::min(kBlock, p.nq - i0)},
                  lse.data() + bh * p.nq + i0, dd.data() + bh * p.nq + i0, ws);
    }
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t item = 0; item < heads * kblocks; ++item) {
      const int64_t bh = item / kblocks, j0 = (item % kblocks) * kBlock;
      key_block(bp, causal, bh / p.heads, bh % p.heads, {j0, std::min(kBlock, p.nk - j0)},
                lse.data() + bh * p.nq, dd.data() + bh * p.nq, ws);
    }
    clock.done(arrived);
  }
}

}  // namespace favor::cpu
