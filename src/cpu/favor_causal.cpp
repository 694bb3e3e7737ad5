// Causal FAVOR attention in chunks of C = kChunk tokens (Config::chunk), per (batch, head):
//   [Y_c | den_c] = [phi(Q_c) | tril(phi(Q_c) phi(K_c)^T)] [S_{<c} | s_{<c} ; V_c | 1]
//   [S | s]_{<c+1} = [S | s]_{<c} + phi(K_c)^T [V_c | 1]
// The chunk's augmented values sit right below the state in one buffer, so the inter- and
// intra-chunk terms, numerator and denominator, come out of a single GEMM. Per chunk: G,
// the fused output GEMM and the state update; one projection GEMM covers the keys and
// queries of several chunks (kProjectBlock tokens).
//
// Stabilisation is the streaming decoder's, token by token: key j is scaled by its running
// max M_j = max over visible keys <= j (never by a future key, which could underflow every
// key a query may see), and row i rescales what it reads by exp(M_j - M_i) <= 1. Query row
// i is shifted by c_i = max_f (L_if + log P_if), P_i = its exact prefix normaliser, so its
// denominator is >= 1. Masked keys get zero features. The keys and queries of several chunks
// (kProjectBlock tokens) are projected with one GEMM. Memory
// O(threads * (kProjectBlock * (m + D) + C * (F + C))).
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
#include "cpu/causal_chunk.hpp"
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

// Saves the state before chunk `index` of head bh into the context (save_causal_states).
void save_state(const AttentionParams& p, int64_t bh, int64_t index, const HeadState& state) {
  const int64_t n = state.features * state.ld(), slots = kernels::causal_chunks(p.nq) + 1;
  std::copy_n(state.Sx, n, p.ctx_chunk_states + (bh * slots + index) * n);
  p.ctx_chunk_maxima[bh * slots + index] = state.max;
}

// Hybrid attention's linear part (p.part_rows): the chunk's [num | den] rows and their log
// scales c_i + M_i (-inf for a row that saw no key).
void save_part_rows(const AttentionParams& p, int64_t bh, int64_t c0, int64_t rows,
                    const ChunkWorkspace& ws) {
  const int64_t ld = p.dv + 1;
  std::copy_n(ws.yx.data(), rows * ld, p.part_rows + (bh * p.nq + c0) * ld);
  for (int64_t r = 0; r < rows; ++r) {
    const double c = ws.qshift[r], M = ws.run_max[r];
    p.part_shift[bh * p.nq + c0 + r] = std::isinf(c) || std::isinf(M) ? -INFINITY : c + M;
  }
}

// The same rows to a hybrid call's hook (p.part_hook).
void hand_part_rows(const AttentionParams& p, int64_t bh, int64_t c0, int64_t rows,
                    const ChunkWorkspace& ws) {
  double shift[kChunk];
  for (int64_t r = 0; r < rows; ++r) {
    const double c = ws.qshift[r], M = ws.run_max[r];
    shift[r] = std::isinf(c) || std::isinf(M) ? -INFINITY : c + M;
  }
  p.part_hook->rows(bh, c0, rows, ws.yx.data(), shift);
}

// Causal sweep over rows [begin, end) of head (b, h), starting from the state in ws.sv
// (the keys before `begin`, relative to `max`), which it advances. Returns the rows written
// as zeros. With a context (p.ctx_chunk_states; chunk == kChunk) it saves each chunk's
// starting state, the final one and every row's [num | den].
int64_t sweep(const AttentionParams& p, int64_t chunk, int64_t b, int64_t h, int64_t begin,
              int64_t end, double& max, ChunkWorkspace& ws) {
  const int64_t F = ws.F, dv = p.dv;
  // A hybrid part (p.part_rows) may leave out null: its rows are all it needs.
  float* oh = p.out ? p.out + b * p.out_strides[0] + h * p.out_strides[1] : nullptr;
  HeadState state = ws.state();
  state.max = max;
  float* vx = ws.sv.data() + F * (dv + 1);  // the chunk's [V_c | 1], right below the state
  int64_t zero_rows = 0;
  const int64_t bh = b * p.heads + h;
  const bool save = p.ctx_chunk_states != nullptr;
  // The state after `end` is read by a context or a decoder's prefill (final_states) only:
  // otherwise the last chunk does not update it (a short call's one chunk never does).
  const bool keep = save || p.final_states != nullptr;
  // Blocks of whole chunks (at least one) projected at once.
  const int64_t block = std::max<int64_t>(1, kProjectBlock / chunk) * chunk;
  ws.forget_block();
  for (int64_t c0 = begin; c0 < end; c0 += chunk) {
    const int64_t rows = std::min(chunk, end - c0);
    if (save) save_state(p, bh, c0 / kChunk, state);
    if (!block_holds(ws, bh, c0, rows)) load_block(p, b, h, c0, std::min(end, c0 + block), ws);
    load_chunk(p, b, h, c0, rows, vx, ws);
    const bool empty = std::isinf(state.max);  // no key before the chunk: [S | s] = 0
    const bool moved = chunk_key_features(p, rows, state.max, ws);
    if (empty)
      std::fill(ws.s.begin(), ws.s.end(), 0.0f);
    else
      state.copy_normaliser(ws.s.data());
    chunk_query_features(p, rows, ws.s.data(), state.max, ws);
    chunk_kernel_matrix(rows, moved, ws);
    chunk_output(rows, state.max, moved, ws, empty);
    if (save) std::copy_n(ws.yx.data(), rows * (dv + 1), p.ctx_rows + (bh * p.nq + c0) * (dv + 1));
    if (p.part_rows) save_part_rows(p, bh, c0, rows, ws);
    if (p.part_hook) hand_part_rows(p, bh, c0, rows, ws);
    if (oh)
      zero_rows += write_rows(ws.yx.data(), rows, dv, oh + c0 * p.out_strides[2], p.out_strides[2],
                              p.out_strides[3]);
    if (keep || c0 + rows < end) chunk_state_update(rows, moved, state, vx, ws);
  }
  if (save && end == p.nq) save_state(p, bh, kernels::causal_chunks(p.nq), state);
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

// The state before the first key: the earlier ranks' keys (sequence parallel), else empty.
void initial_state(const AttentionParams& p, int64_t bh, HeadState& state) {
  state.clear();
  if (p.init_states == nullptr) return;
  const int64_t n = state.features * state.ld();
  std::copy(p.init_states + bh * n, p.init_states + (bh + 1) * n, state.Sx);
  state.max = p.init_maxima[bh];
}

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

// The state after a head's last key, for the decoder's prefill (if asked).
void final_state(const AttentionParams& p, int64_t bh, const HeadState& state) {
  if (p.final_states == nullptr) return;
  const int64_t n = state.features * state.ld();
  std::copy(state.Sx, state.Sx + n, p.final_states + bh * n);
  p.final_maxima[bh] = state.max;
}

}  // namespace

int64_t favor_causal(const AttentionParams& p, const Config& config) {
  const int64_t F = p.map.features();
  // A saved context's states sit at kChunk boundaries (segment bounds are multiples of it).
  const int64_t chunk = p.ctx_chunk_states ? kChunk : config.chunk;
  const double flops = double(p.batch * p.heads) * double(p.nq) *
                       (4.0 * double(p.d * p.map.m) + 4.0 * double(F * (p.dv + 1)));
  const Schedule plan = make_schedule(p.batch * p.heads, config.threads, flops);
  auto lease = lend_workspaces<ChunkWorkspace>(plan.team, p.d, p.map.m, F, p.dv);
  std::vector<ChunkWorkspace>& spaces = lease.spaces();
  if (plan.parts == 1) {
    return for_each_head(plan, spaces, [&](int64_t bh, ChunkWorkspace& ws) {
      HeadState state = ws.state();
      if (p.nq <= chunk && !p.init_states && !p.ctx_chunk_states && !p.final_states)
        state.max = -INFINITY;  // one chunk from no state, none kept: [S | s] is never touched
      else
        initial_state(p, bh, state);
      const int64_t zero_rows = sweep(p, chunk, bh / p.heads, bh % p.heads, 0, p.nq, state.max, ws);
      final_state(p, bh, state);
      return zero_rows;
    });
  }

  int64_t zero_rows = 0;
  const std::vector<int64_t> bounds = segment_bounds(p.nq, plan.parts);
  Published published(plan.tasks, F, p.dv);
  // Tasks run in increasing order on each thread and depend only on lower tasks, which
  // publish before their long sweep: no deadlock even with fewer threads than tasks.
  const int team_size = team_now(plan.team, plan.flops);
  RegionClock clock(team_size);
#pragma omp parallel num_threads(team_size) reduction(+ : zero_rows)
  {
    const int64_t arrived = clock.arrive();
    blas_on_calling_thread();
    const int tid = omp_get_thread_num(), team = omp_get_num_threads();
    ChunkWorkspace& ws = spaces[static_cast<size_t>(tid)];
    for (int64_t task = tid; task < plan.tasks; task += team) {
      const int64_t bh = task / plan.parts, seg = task % plan.parts;
      const int64_t b = bh / p.heads, h = bh % p.heads;
      HeadState state = ws.state();
      if (seg == 0)
        initial_state(p, bh, state);
      else
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
      zero_rows += sweep(p, chunk, b, h, bounds[seg], bounds[seg + 1], state.max, ws);
      if (seg + 1 == plan.parts) final_state(p, bh, state);
    }
    clock.done(arrived);
  }
  return zero_rows;
}

}  // namespace favor::cpu
