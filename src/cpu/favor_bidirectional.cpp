// Bidirectional FAVOR attention, per (batch, head):
//   1. keys, in tiles: project, stabilise against the running key max,
//      [S | s] += phi^T [V | 1] (cpu/key_state.hpp);
//   2. log s once;
//   3. queries, in tiles: project, shift each row by c_i = max_f (L_if + log s_f),
//      [y | den] = phi [S | s] (one GEMM), y / den.
// When there are fewer heads than threads, each head's keys and queries are split into
// parts: partial states (each with its own max) are merged after a barrier.
// Never holds more than one tile of features: memory O(threads * kRowTile * F).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/attention_params.hpp"
#include "cpu/blas.hpp"
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
  std::vector<float> yx, Sx, s, log_s;
  Workspace(int64_t d, int64_t m, int64_t F, int64_t dv)
      : tile(d, m, F, dv), yx(kRowTile * (dv + 1)), Sx(F * (dv + 1)), s(F), log_s(F) {}
  HeadState state(int64_t F, int64_t dv) { return HeadState{Sx.data(), F, dv}; }
};

// Partial key states of every task, allocated once per call.
struct PartialStates {
  std::vector<float> Sx;
  std::vector<double> max;
  int64_t F, dv;
  PartialStates(int64_t tasks, int64_t F_, int64_t dv_)
      : Sx(tasks * F_ * (dv_ + 1)), max(tasks, -INFINITY), F(F_), dv(dv_) {}
  HeadState at(int64_t task) {
    return HeadState{Sx.data() + task * F * (dv + 1), F, dv, max[task]};
  }
};

// Saves a head's complete key state into the caller's context, if one was asked for.
void save_state(const AttentionParams& p, int64_t bh, const HeadState& state) {
  if (p.ctx_states == nullptr) return;
  const int64_t n = state.features * state.ld();
  std::copy(state.Sx, state.Sx + n, p.ctx_states + bh * n);
  p.ctx_maxima[bh] = state.max;
}

// The complete key state given by a sequence-parallel caller (p.init_states), into `state`.
void load_state(const AttentionParams& p, int64_t bh, HeadState& state) {
  const int64_t n = state.features * state.ld();
  std::copy(p.init_states + bh * n, p.init_states + (bh + 1) * n, state.Sx);
  state.max = p.init_maxima[bh];
}

// Queries [begin, end) of head (b, h) against the complete key state; returns zero rows.
int64_t attend_queries(const AttentionParams& p, int64_t b, int64_t h, int64_t begin, int64_t end,
                       const HeadState& state, Workspace& ws) {
  if (std::isinf(state.max)) {  // no visible key: every row is defined as zeros
    write_zero_rows(p.out + b * p.out_strides[0] + h * p.out_strides[1] + begin * p.out_strides[2],
                    end - begin, p.dv, p.out_strides[2], p.out_strides[3]);
    return end - begin;
  }
  const int64_t m = p.map.m, F = state.features, bh = b * p.heads + h;
  const float* qh = p.q + b * p.q_strides[0] + h * p.q_strides[1];
  float* oh = p.out + b * p.out_strides[0] + h * p.out_strides[1];
  if (positive_family(p.map.kernel)) {
    state.copy_normaliser(ws.s.data());
    log_or_neg_inf(ws.s.data(), ws.log_s.data(), F);
  }
  int64_t zero_rows = 0;
  for (int64_t i0 = begin; i0 < end; i0 += kRowTile) {
    const int64_t rows = std::min(kRowTile, end - i0);
    gather_rows(qh + i0 * p.q_strides[2], p.q_strides[2], p.q_strides[3], rows, p.d,
                p.map.sqrt_scale, ws.tile.x.data(), nullptr);
    project_rows(ws.tile.x.data(), rows, p.d, p.map.head_w(bh), m, ws.tile.a.data(),
                 p.map.head_bias(bh));
    for (int64_t r = 0; r < rows; ++r) {
      const float* a = ws.tile.a.data() + r * m;
      const float c = query_shift(p.map.kernel, a, m, ws.log_s.data());
      query_features(p.map.kernel, a, m, c, ws.log_s.data(), ws.tile.phi.data() + r * F);
    }
    gemm(false, false, rows, state.ld(), F, 1.0f, ws.tile.phi.data(), F, state.Sx, state.ld(), 0.0f,
         ws.yx.data(), state.ld());
    zero_rows += write_rows(ws.yx.data(), rows, p.dv, oh + i0 * p.out_strides[2], p.out_strides[2],
                            p.out_strides[3]);
  }
  return zero_rows;
}

}  // namespace

int64_t favor_bidirectional(const AttentionParams& p, const Config& config) {
  if (favor_bidirectional_short_pays(p)) return favor_bidirectional_short(p, config);
  const int64_t F = p.map.features();
  const double flops = double(p.batch * p.heads) * double(p.nq + p.nk) *
                       (2.0 * double(p.d * p.map.m) + 2.0 * double(F * (p.dv + 1)));
  const Schedule plan = make_schedule(p.batch * p.heads, config.threads, flops);
  auto lease = lend_workspaces<Workspace>(plan.team, p.d, p.map.m, F, p.dv);
  std::vector<Workspace>& spaces = lease.spaces();
  if (plan.parts == 1) {
    return for_each_head(plan, spaces, [&](int64_t bh, Workspace& ws) {
      const int64_t b = bh / p.heads, h = bh % p.heads;
      HeadState state = ws.state(F, p.dv);
      if (p.init_states) {
        load_state(p, bh, state);
      } else {
        state.clear();
        accumulate_keys(p, b, h, 0, p.nk, ws.tile, state);
      }
      save_state(p, bh, state);
      return attend_queries(p, b, h, 0, p.nq, state, ws);
    });
  }

  int64_t zero_rows = 0;
  PartialStates partial(plan.tasks, F, p.dv);
  const int team_size = team_now(plan.team, plan.flops);
  RegionClock clock(team_size);
#pragma omp parallel num_threads(team_size) reduction(+ : zero_rows)
  {
    const int64_t arrived = clock.arrive();
    blas_on_calling_thread();
    const int tid = omp_get_thread_num(), team = omp_get_num_threads();
    Workspace& ws = spaces[static_cast<size_t>(tid)];
    for (int64_t task = tid; task < plan.tasks && !p.init_states; task += team) {  // keys
      const int64_t bh = task / plan.parts, part = task % plan.parts;
      HeadState st = partial.at(task);
      st.clear();
      accumulate_keys(p, bh / p.heads, bh % p.heads, split_point(p.nk, plan.parts, part),
                      split_point(p.nk, plan.parts, part + 1), ws.tile, st);
      partial.max[task] = st.max;
    }
#pragma omp barrier
    for (int64_t task = tid; task < plan.tasks; task += team) {  // queries of each part
      const int64_t bh = task / plan.parts, part = task % plan.parts;
      HeadState merged = ws.state(F, p.dv);
      if (p.init_states) {
        load_state(p, bh, merged);
      } else {
        merged.copy_from(partial.at(bh * plan.parts));
        for (int64_t other = 1; other < plan.parts; ++other)
          merged.add(partial.at(bh * plan.parts + other));
      }
      if (part == 0) save_state(p, bh, merged);
      zero_rows +=
          attend_queries(p, bh / p.heads, bh % p.heads, split_point(p.nq, plan.parts, part),
                         split_point(p.nq, plan.parts, part + 1), merged, ws);
    }
    clock.done(arrived);
  }
  return zero_rows;
}

}  // namespace favor::cpu
