// Causal FAVOR attention in chunks of C = kChunk tokens, per (batch, head):
//   [Y_c | den_c] = [phi(Q_c) | tril(phi(Q_c) phi(K_c)^T)] [S_{<c} | s_{<c} ; V_c | 1]
//   [S | s]_{<c+1} = [S | s]_{<c} + phi(K_c)^T [V_c | 1]
// The chunk's augmented values sit right below the state in one buffer, so the inter- and
// intra-chunk terms, numerator and denominator, come out of a single GEMM. Per chunk:
// one projection GEMM for keys and queries together, G, the fused output GEMM, and the
// state update.
//
// Stabilisation is the streaming decoder's, token by token: key j is scaled by its running
// max M_j = max over visible keys <= j (never by a future key, which could underflow every
// key a query may see), and row i rescales what it reads by exp(M_j - M_i) <= 1. Query row
// i is shifted by c_i = max_f (L_if + log P_if), P_i = its exact prefix normaliser, so its
// denominator is >= 1. Masked keys get zero features. Memory O(threads * C * (F + C + D)).
//
// With fewer heads than threads, each head's sequence is split into segments, one per
// thread, chained: the thread of segment s first computes the local key state of segment
// s-1 (keys only, cpu/key_state.hpp), waits until the state before segment s-1 is
// published, publishes the state before segment s (their sum) and sweeps its segment.
// Segment 0 starts at once; later segments are shorter by the cost of that extra key pass.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <thread>
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

// Cost of the keys-only pass over a token relative to a causal sweep over it; sets the
// segment lengths. Measured with favor bench on one thread, B*H = 1, N = 16384: a key pass
// is about half a bidirectional pass (0.0304 s / 2) against a causal sweep of 0.0353 s.
constexpr double kKeyPassCost = 0.43;

struct Workspace {
  int64_t F, dv;
  std::vector<float> x;       // 2C x d: the chunk's keys, then its queries
  std::vector<float> a;       // 2C x m: their projections
  std::vector<float> phik;    // C x F
  std::vector<float> qg;      // C x (F + C): [phi(Q_c) | G]
  std::vector<float> prefix;  // C x F: prefix normalisers, then their logs
  std::vector<float> sv;      // (F + C) x (dv + 1): [S | s] of the state, then [V_c | 1]
  std::vector<float> yx;      // C x (dv + 1)
  std::vector<float> s;       // F: the state's normaliser column
  std::vector<float> local;   // F x (dv + 1): a segment's local key state
  std::vector<double> half_norm2, g, run_max;
  std::vector<char> visible;
  KeyTile tile;
  Workspace(int64_t d, int64_t m, int64_t F_, int64_t dv_)
      : F(F_),
        dv(dv_),
        x(2 * kChunk * d),
        a(2 * kChunk * m),
        phik(kChunk * F_),
        qg(kChunk * (F_ + kChunk)),
        prefix(kChunk * F_),
        sv((F_ + kChunk) * (dv_ + 1)),
        yx(kChunk * (dv_ + 1)),
        s(F_),
        local(F_ * (dv_ + 1)),
        half_norm2(kChunk),
        g(kChunk),
        run_max(kChunk),
        visible(kChunk),
        tile(d, m, F_, dv_) {}
  HeadState state() { return HeadState{sv.data(), F, dv}; }
  int64_t ldq() const { return F + kChunk; }
};

// exp(from - to) for running maxima from <= to; 1 when equal (also both -inf).
float rescale(double from, double to) {
  return from == to ? 1.0f : static_cast<float>(std::exp(from - to));
}

// Key features of one chunk, each relative to its running max run_max[r] (zeros for masked
// keys). Returns true if the running max moved inside the chunk.
bool chunk_key_features(const AttentionParams& p, int64_t rows, const HeadState& state,
                        Workspace& ws) {
  const int64_t m = p.m, F = ws.F;
  double running = state.max;
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = ws.a.data() + r * m;
    ws.g[r] = key_log_weight(p.kernel, ws.half_norm2[r]);
    if (ws.visible[r]) running = std::max(running, key_log_max(p.kernel, a, m, ws.g[r]));
    ws.run_max[r] = running;
    float* phi = ws.phik.data() + r * F;
    if (ws.visible[r]) {
      key_features(p.kernel, a, m, ws.g[r] - running, phi);
    } else {
      std::fill(phi, phi + F, 0.0f);
    }
  }
  return ws.run_max[0] != ws.run_max[rows - 1] || ws.run_max[0] != state.max;
}

// Query features of one chunk into the left block of qg. For the positive family each
// row's shift comes from its exact prefix normaliser P_i = P_{i-1} exp(M_{i-1} - M_i) +
// phi(k_i), P_{-1} = s_{<c} (computed in ws.prefix, then overwritten by its log).
void chunk_query_features(const AttentionParams& p, int64_t rows, const HeadState& state,
                          Workspace& ws) {
  const int64_t m = p.m, F = ws.F;
  const float* aq = ws.a.data() + rows * m;
  const bool pos = positive_family(p.kernel);
  if (pos) state.copy_normaliser(ws.s.data());
  for (int64_t r = 0; pos && r < rows; ++r) {
    float* row = ws.prefix.data() + r * F;
    const float* prev = r == 0 ? ws.s.data() : row - F;  // still the raw prefix of row r-1
    const float f = rescale(r == 0 ? state.max : ws.run_max[r - 1], ws.run_max[r]);
    const float* phik = ws.phik.data() + r * F;
    for (int64_t x = 0; x < F; ++x) row[x] = prev[x] * f + phik[x];
  }
  if (pos) log_or_neg_inf(ws.prefix.data(), ws.prefix.data(), rows * F);
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = aq + r * m;
    float* phi = ws.qg.data() + r * ws.ldq();
    const float* log_p = ws.prefix.data() + r * F;
    const float c = query_shift(p.kernel, a, m, log_p);
    if (std::isinf(c)) {  // no visible key yet: zero features give a zero denominator
      std::fill(phi, phi + F, 0.0f);
    } else {
      query_features(p.kernel, a, m, c, log_p, phi);
    }
  }
}

// Causal sweep over rows [begin, end) of head (b, h), starting from the state in ws.sv
// (the keys before `begin`), which it advances. Returns the rows written as zeros.
int64_t sweep(const AttentionParams& p, int64_t b, int64_t h, int64_t begin, int64_t end,
              double& max, Workspace& ws) {
  const int64_t F = ws.F, dv = p.dv, ldv = dv + 1, ldq = ws.ldq();
  const float* qh = p.q + b * p.q_strides[0] + h * p.q_strides[1];
  const float* kh = p.k + b * p.k_strides[0] + h * p.k_strides[1];
  const float* vh = p.v + b * p.v_strides[0] + h * p.v_strides[1];
  float* oh = p.out + b * p.out_strides[0] + h * p.out_strides[1];
  HeadState state = ws.state();
  state.max = max;
  float* vx = ws.sv.data() + F * ldv;  // the chunk's [V_c | 1], right below the state
  float* G = ws.qg.data() + F;         // right of phi(Q_c)
  int64_t zero_rows = 0;

  for (int64_t c0 = begin; c0 < end; c0 += kChunk) {
    const int64_t rows = std::min(kChunk, end - c0);
    for (int64_t r = 0; r < rows; ++r) {
      ws.visible[r] =
          p.mask == nullptr || p.mask[b * p.mask_stride_b + (c0 + r) * p.mask_stride_n] != 0;
    }
    gather_rows(kh + c0 * p.k_strides[2], p.k_strides[2], p.k_strides[3], rows, p.d, p.sqrt_scale,
                ws.x.data(), ws.half_norm2.data());
    gather_rows(qh + c0 * p.q_strides[2], p.q_strides[2], p.q_strides[3], rows, p.d, p.sqrt_scale,
                ws.x.data() + rows * p.d, nullptr);
    gather_values(vh + c0 * p.v_strides[2], p.v_strides[2], p.v_strides[3], rows, dv, vx);
    project_rows(ws.x.data(), 2 * rows, p.d, p.w, p.m, ws.a.data());  // keys and queries at once

    const bool moved = chunk_key_features(p, rows, state, ws);
    chunk_query_features(p, rows, state, ws);

    // G = phi(Q_c) phi(K_c)^T, lower triangle (j <= i), each term read at scale exp(M_j - M_i).
    gemm(false, true, rows, rows, F, 1.0f, ws.qg.data(), ldq, ws.phik.data(), F, 0.0f, G, ldq);
    for (int64_t i = 0; i < rows; ++i) {
      float* gi = G + i * ldq;
      std::fill(gi + i + 1, gi + rows, 0.0f);
      if (moved) {
        for (int64_t j = 0; j <= i; ++j) gi[j] *= rescale(ws.run_max[j], ws.run_max[i]);
      }
    }
    // The state is read by row i at scale exp(M_{<c} - M_i): scale phi(q_i) (after G).
    if (moved) {
      for (int64_t i = 0; i < rows; ++i) {
        const float f = rescale(state.max, ws.run_max[i]);
        float* phi = ws.qg.data() + i * ldq;
        for (int64_t x = 0; x < F; ++x) phi[x] *= f;
      }
    }
    gemm(false, false, rows, ldv, F + rows, 1.0f, ws.qg.data(), ldq, ws.sv.data(), ldv, 0.0f,
         ws.yx.data(), ldv);
    zero_rows += write_rows(ws.yx.data(), rows, dv, oh + c0 * p.out_strides[2], p.out_strides[2],
                            p.out_strides[3]);

    // State update, relative to the chunk's last running max.
    const double last = ws.run_max[rows - 1];
    if (last > state.max) state.raise_max(last);
    if (moved) {
      for (int64_t j = 0; j < rows; ++j) {
        const float f = rescale(ws.run_max[j], last);
        float* phi = ws.phik.data() + j * F;
        for (int64_t x = 0; x < F; ++x) phi[x] *= f;
      }
    }
    state.accumulate(ws.phik.data(), vx, rows);
  }
  max = state.max;
  return zero_rows;
}

// States published by the segments of a split head: the state before segment `task`.
struct Published {
  std::vector<float> Sx;
  std::vector<double> max;
  std::unique_ptr<std::atomic<int>[]> ready;
  int64_t F, dv;
  Published(int64_t tasks, int64_t F_, int64_t dv_)
      : Sx(tasks * F_ * (dv_ + 1)), max(tasks), ready(new std::atomic<int>[tasks]), F(F_), dv(dv_) {
    for (int64_t t = 0; t < tasks; ++t) ready[t].store(0);
  }
  HeadState at(int64_t task) {
    return HeadState{Sx.data() + task * F * (dv + 1), F, dv, max[task]};
  }
  void publish(int64_t task, const HeadState& st) {
    HeadState dst = at(task);
    dst.copy_from(st);
    max[task] = st.max;
    ready[task].store(1, std::memory_order_release);
  }
  void wait(int64_t task) const {
    while (ready[task].load(std::memory_order_acquire) == 0) std::this_thread::yield();
  }
};

// Segment boundaries (multiples of kChunk) of a sequence of n tokens split into `parts`:
// segment 0 costs L0, segment s costs kKeyPassCost * L(s-1) + L(s); all equal.
std::vector<int64_t> segment_bounds(int64_t n, int64_t parts) {
  std::vector<double> weight(parts);
  double total = 0.0;
  for (int64_t s = 0; s < parts; ++s) {
    weight[s] = s == 0 ? 1.0 : 1.0 - kKeyPassCost * weight[s - 1];
    total += weight[s];
  }
  std::vector<int64_t> bounds{0};
  double acc = 0.0;
  for (int64_t s = 0; s + 1 < parts; ++s) {
    acc += weight[s];
    const auto cut =
        static_cast<int64_t>(std::llround(double(n) * acc / total / double(kChunk))) * kChunk;
    bounds.push_back(std::clamp(cut, bounds.back(), n));
  }
  bounds.push_back(n);
  return bounds;
}

}  // namespace

int64_t favor_causal(const AttentionParams& p) {
  const int64_t F = feature_count(p.kernel, p.m);
  const Schedule plan = make_schedule(p.batch * p.heads, p.threads);
  std::vector<Workspace> spaces = make_workspaces<Workspace>(plan.team, p.d, p.m, F, p.dv);
  if (plan.parts == 1) {
    return for_each_head(plan, spaces, [&](int64_t bh, Workspace& ws) {
      HeadState state = ws.state();
      state.clear();
      return sweep(p, bh / p.heads, bh % p.heads, 0, p.nq, state.max, ws);
    });
  }

  int64_t zero_rows = 0;
  const std::vector<int64_t> bounds = segment_bounds(p.nq, plan.parts);
  Published published(plan.tasks, F, p.dv);
  // Tasks run in increasing order on each thread and depend only on lower tasks, which
  // publish before their long sweep: no deadlock even with fewer threads than tasks.
#pragma omp parallel num_threads(plan.team) reduction(+ : zero_rows)
  {
    blas_on_calling_thread();
    const int tid = omp_get_thread_num(), team = omp_get_num_threads();
    Workspace& ws = spaces[static_cast<size_t>(tid)];
    for (int64_t task = tid; task < plan.tasks; task += team) {
      const int64_t bh = task / plan.parts, seg = task % plan.parts;
      const int64_t b = bh / p.heads, h = bh % p.heads;
      HeadState state = ws.state();
      state.clear();
      if (seg > 0) {
        HeadState local{ws.local.data(), F, p.dv};
        local.clear();
        accumulate_keys(p, b, h, bounds[seg - 1], bounds[seg], ws.tile, local);
        published.wait(task - 1);
        state.copy_from(published.at(task - 1));
        state.add(local);
      }
      published.publish(task, state);
      zero_rows += sweep(p, b, h, bounds[seg], bounds[seg + 1], state.max, ws);
    }
  }
  return zero_rows;
}

}  // namespace favor::cpu
