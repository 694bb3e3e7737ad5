// Bidirectional FAVOR attention with bf16 GEMMs (AttentionOptions::precision = bf16): the
// algorithm of favor_bidirectional.cpp, one head per task, with every GEMM operand rounded
// to bf16 and fp32 accumulation (cpu/bf16_gemm.hpp):
//   keys, in tiles: a = bf16(k) bf16(W)^T; phi in fp32 (running-max stabiliser), then
//     [S | s]^T += bf16([V | 1])^T bf16(phi) into the fp32 state, held transposed
//     ((dv + 1) x F: the GEMM's N is then F = 256, not dv + 1 = 65, which oneDNN's bf16
//     kernels run ~1.5x faster here);
//   queries, in tiles: a = bf16(q) bf16(W)^T; phi in fp32; y = bf16(phi) bf16(S) (N = dv)
//     and den = bf16(phi) . s with s in fp32 (the normaliser is not rounded).
// FAVOR+ features without feature weights go straight to bf16 (cpu/bf16_features.hpp);
// norms, shifts, the stabiliser and the division stay in fp32 / double. The added error is
// bounded in docs/numerics.md ("bf16 forward").
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/attention_params.hpp"
#include "cpu/bf16_features.hpp"
#include "cpu/bf16_gemm.hpp"
#include "cpu/feature_tile.hpp"
#include "cpu/head_state.hpp"
#include "cpu/key_state.hpp"
#include "cpu/schedule.hpp"
#include "cpu/tiles.hpp"
#include "cpu/vec_math.hpp"

namespace favor::cpu {
namespace {

struct Workspace {
  KeyTile tile;
  std::vector<bf16_t> w, x, phi, vx, S;
  std::vector<float> state_t, S_f, yx, log_s;
  Workspace(int64_t d, int64_t m, int64_t F, int64_t dv)
      : tile(d, m, F, dv),
        w(m * d),
        x(kRowTile * d),
        phi(kRowTile * F),
        vx(kRowTile * (dv + 1)),
        S(F * dv),
        state_t((dv + 1) * F),
        S_f(F * dv),
        yx(kRowTile * (dv + 1)),
        log_s(F) {}
};

// [S | s]^T relative to exp(max): (dv + 1) x F, row dv = s.
struct StateT {
  float* St;
  int64_t F, dv;
  double max = -INFINITY;
  const float* s() const { return St + dv * F; }
};

// Features exp(a + const), m of them, without feature weights (FAVOR+, FAVOR++, FAVOR#):
// computed straight into bf16 (cpu/bf16_features.hpp). Other maps: their fp32 features,
// rounded.
bool plain_positive(const AttentionParams& p, int64_t bh) {
  const Kernel k = p.map.kernel;
  return (k == Kernel::positive || k == Kernel::favorpp || k == Kernel::favorsharp) &&
         p.map.head_key_logw(bh) == nullptr;
}

// a[rows x m] = bf16(x) bf16(W)^T (+ bias), W already in ws.w.
void project_bf16(const AttentionParams& p, int64_t bh, int64_t rows, Workspace& ws) {
  const int64_t m = p.map.m;
  to_bf16(ws.tile.x.data(), ws.x.data(), rows * p.d);
  gemm_bf16(false, true, rows, m, p.d, ws.x.data(), p.d, ws.w.data(), p.d, 0.0f, ws.tile.a.data(),
            m);
  const float* bias = p.map.head_bias(bh);
  if (!bias) return;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t f = 0; f < m; ++f) ws.tile.a[r * m + f] += bias[f];
}

// Keys [begin, end) of head (b, h) into `state` (zeroed by the caller), W_h in ws.w.
void accumulate_keys_bf16(const AttentionParams& p, int64_t b, int64_t h, int64_t begin,
                          int64_t end, StateT& state, Workspace& ws) {
  const int64_t m = p.map.m, F = state.F, ld = state.dv + 1, bh = b * p.heads + h;
  KeyTile& t = ws.tile;
  for (int64_t next = begin; next < end;) {
    const int64_t rows = gather_key_tile(p, b, h, &next, end, t);
    if (rows == 0) break;
    project_bf16(p, bh, rows, ws);
    double tile_max = -INFINITY;
    for (int64_t r = 0; r < rows; ++r) {
      t.g[r] = p.map.key_log_weight(t.half_norm2[r], bh, p.first_position + t.index[r]);
      tile_max = std::max(tile_max, key_log_max(p.map, bh, t.a.data() + r * m, t.g[r]));
    }
    if (tile_max > state.max) {  // rescale the sums so far to the new max
      if (!std::isinf(state.max)) {
        const auto f = static_cast<float>(std::exp(state.max - tile_max));
        for (int64_t i = 0; i < ld * F; ++i) state.St[i] *= f;
      }
      state.max = tile_max;
    }
    if (plain_positive(p, bh)) {
      for (int64_t r = 0; r < rows; ++r)
        exp_to_bf16(t.a.data() + r * m, static_cast<float>(t.g[r] - state.max),
                    ws.phi.data() + r * F, m);
    } else {
      for (int64_t r = 0; r < rows; ++r)
        key_features(p.map, bh, t.a.data() + r * m, t.g[r] - state.max, t.phi.data() + r * F);
      to_bf16(t.phi.data(), ws.phi.data(), rows * F);
    }
    to_bf16(t.vx.data(), ws.vx.data(), rows * ld);
    gemm_bf16(true, false, ld, F, rows, ws.vx.data(), ld, ws.phi.data(), F, 1.0f, state.St, F);
  }
}

// Queries [begin, end) of head (b, h) against the complete key state, W_h in ws.w; returns
// the zero rows.
int64_t attend_queries_bf16(const AttentionParams& p, int64_t b, int64_t h, int64_t begin,
                            int64_t end, const StateT& state, Workspace& ws) {
  const int64_t m = p.map.m, F = state.F, dv = p.dv, ld = dv + 1, bh = b * p.heads + h;
  float* oh = p.out + b * p.out_strides[0] + h * p.out_strides[1];
  if (std::isinf(state.max)) {  // no visible key: every row is defined as zeros
    write_zero_rows(oh + begin * p.out_strides[2], end - begin, dv, p.out_strides[2],
                    p.out_strides[3]);
    return end - begin;
  }
  const float* qh = p.q + b * p.q_strides[0] + h * p.q_strides[1];
  if (positive_family(p.map.kernel)) log_or_neg_inf(state.s(), ws.log_s.data(), F);
  for (int64_t f = 0; f < F; ++f)  // S (F x dv) from the transposed state, then bf16
    for (int64_t x = 0; x < dv; ++x) ws.S_f[f * dv + x] = state.St[x * F + f];
  to_bf16(ws.S_f.data(), ws.S.data(), F * dv);
  int64_t zero_rows = 0;
  for (int64_t i0 = begin; i0 < end; i0 += kRowTile) {
    const int64_t rows = std::min(kRowTile, end - i0);
    gather_rows(qh + i0 * p.q_strides[2], p.q_strides[2], p.q_strides[3], rows, p.d,
                p.map.sqrt_scale, ws.tile.x.data(), nullptr);
    project_bf16(p, bh, rows, ws);
    const bool plain = plain_positive(p, bh);
    for (int64_t r = 0; r < rows; ++r) {
      const float* a = ws.tile.a.data() + r * m;
      const float c = query_shift(p.map.kernel, a, m, ws.log_s.data());
      if (plain) {
        exp_live_to_bf16(a, c, ws.log_s.data(), ws.phi.data() + r * F, m);
      } else {
        query_features(p.map.kernel, a, m, c, ws.log_s.data(), ws.tile.phi.data() + r * F);
      }
    }
    if (!plain) to_bf16(ws.tile.phi.data(), ws.phi.data(), rows * F);
    gemm_bf16(false, false, rows, dv, F, ws.phi.data(), F, ws.S.data(), dv, 0.0f, ws.yx.data(), ld);
    dot_rows_bf16(ws.phi.data(), rows, F, state.s(), ws.yx.data() + dv, ld);
    zero_rows += write_rows(ws.yx.data(), rows, dv, oh + i0 * p.out_strides[2], p.out_strides[2],
                            p.out_strides[3]);
  }
  return zero_rows;
}

// The state in the context's layout, [S | s] (F x (dv + 1)), for the backward pass.
void save_state(const AttentionParams& p, int64_t bh, const StateT& state) {
  const int64_t ld = state.dv + 1;
  float* out = p.ctx_states + bh * state.F * ld;
  for (int64_t f = 0; f < state.F; ++f)
    for (int64_t x = 0; x < ld; ++x) out[f * ld + x] = state.St[x * state.F + f];
  p.ctx_maxima[bh] = state.max;
}

// Partial key states of every task (a part of one head's keys), allocated once per call.
struct PartialStates {
  std::vector<float> St;
  std::vector<double> max;
  int64_t size;  // floats per state
  PartialStates(int64_t tasks, int64_t size_)
      : St(tasks * size_, 0.0f), max(tasks, -INFINITY), size(size_) {}
};

// merged = the sum of `parts` partial states from `first`, each rescaled to the largest max.
void merge_parts(const PartialStates& partial, int64_t first, int64_t parts, StateT& merged) {
  merged.max = -INFINITY;
  for (int64_t i = 0; i < parts; ++i) merged.max = std::max(merged.max, partial.max[first + i]);
  std::fill(merged.St, merged.St + partial.size, 0.0f);
  for (int64_t i = 0; i < parts; ++i) {
    if (std::isinf(partial.max[first + i])) continue;  // no visible key in this part
    const auto f = static_cast<float>(std::exp(partial.max[first + i] - merged.max));
    const float* part = partial.St.data() + (first + i) * partial.size;
    for (int64_t e = 0; e < partial.size; ++e) merged.St[e] += f * part[e];
  }
}

}  // namespace

// As favor_bidirectional: one task per (batch, head), or, with fewer heads than threads,
// `parts` tasks per head (keys into partial states, merged after a barrier, then queries).
int64_t favor_bidirectional_bf16(const AttentionParams& p, const Config& config) {
  const int64_t F = p.map.features(), size = (p.dv + 1) * F;
  const Schedule plan = make_schedule(p.batch * p.heads, config.threads);
  std::vector<Workspace> spaces = make_workspaces<Workspace>(plan.team, p.d, p.map.m, F, p.dv);
  if (plan.parts == 1) {
    return for_each_head(plan, spaces, [&](int64_t bh, Workspace& ws) {
      const int64_t b = bh / p.heads, h = bh % p.heads;
      to_bf16(p.map.head_w(bh), ws.w.data(), p.map.m * p.d);
      std::fill(ws.state_t.begin(), ws.state_t.end(), 0.0f);
      StateT state{ws.state_t.data(), F, p.dv};
      accumulate_keys_bf16(p, b, h, 0, p.nk, state, ws);
      if (p.ctx_states) save_state(p, bh, state);
      return attend_queries_bf16(p, b, h, 0, p.nq, state, ws);
    });
  }
  int64_t zero_rows = 0;
  PartialStates partial(plan.tasks, size);
  const int team_size = team_now(plan.team);
  RegionClock clock(team_size);
#pragma omp parallel num_threads(team_size) reduction(+ : zero_rows)
  {
    const int64_t arrived = clock.arrive();
    blas_on_calling_thread();
    const int tid = omp_get_thread_num(), team = omp_get_num_threads();
    Workspace& ws = spaces[static_cast<size_t>(tid)];
    for (int64_t task = tid; task < plan.tasks; task += team) {  // keys
      const int64_t bh = task / plan.parts, part = task % plan.parts;
      to_bf16(p.map.head_w(bh), ws.w.data(), p.map.m * p.d);
      StateT st{partial.St.data() + task * size, F, p.dv};
      accumulate_keys_bf16(p, bh / p.heads, bh % p.heads, split_point(p.nk, plan.parts, part),
                           split_point(p.nk, plan.parts, part + 1), st, ws);
      partial.max[task] = st.max;
    }
#pragma omp barrier
    for (int64_t task = tid; task < plan.tasks; task += team) {  // queries of each part
      const int64_t bh = task / plan.parts, part = task % plan.parts;
      to_bf16(p.map.head_w(bh), ws.w.data(), p.map.m * p.d);
      StateT merged{ws.state_t.data(), F, p.dv};
      merge_parts(partial, bh * plan.parts, plan.parts, merged);
      if (part == 0 && p.ctx_states) save_state(p, bh, merged);
      zero_rows +=
          attend_queries_bf16(p, bh / p.heads, bh % p.heads, split_point(p.nq, plan.parts, part),
                              split_point(p.nq, plan.parts, part + 1), merged, ws);
    }
    clock.done(arrived);
  }
  return zero_rows;
}

}  // namespace favor::cpu
