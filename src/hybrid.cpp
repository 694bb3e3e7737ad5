// Hybrid attention's driver (src/hybrid.hpp): the parts, their frames, the merge and the
// chain rule of the merge. Facade code: it fills kernel params and calls backend().
#include "hybrid.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "core/helper_threads.hpp"
#include "core/pages.hpp"
#include "favor/causal_context.hpp"
#include "favor/runtime.hpp"
#include "kernels/backend.hpp"
#include "kernels/band_params.hpp"

namespace favor::detail {
namespace {

using kernels::AttentionParams;
using kernels::BackwardParams;

// One estimated part: causal FAVOR over a shifted (and, for the suffix, reversed) view in
// which row r is query origin(r) and sees the keys up to r of the view.
struct Part {
  bool reversed = false;
  int64_t offset = 0;  // rows of the view: n - offset
  int64_t rows = 0;
  // [B*H][rows][dv + 1] and [B*H][rows] (full log scales once finished), written whole by
  // the kernel: a saved context's, or the part's own (allocated, not zeroed).
  float* rows_x = nullptr;
  double* shift = nullptr;
  std::unique_ptr<float[]> own_rows;
  std::unique_ptr<double[]> own_shift;
  // The original index of view row r (query) or view key j (key of the same frame).
  int64_t query(int64_t n, int64_t r) const { return reversed ? n - 1 - offset - r : r + offset; }
  int64_t key(int64_t n, int64_t j) const { return reversed ? n - 1 - j : j; }
};

bool visible(const AttentionParams& p, int64_t b, int64_t j) {
  return p.mask == nullptr || p.mask[b * p.mask_stride_b + j * p.mask_stride_n] != 0;
}

// [B][sinks]: each batch row's first `sinks` visible keys, -1 past the last.
std::vector<int64_t> sink_index(const AttentionParams& p, int64_t sinks) {
  std::vector<int64_t> index(static_cast<size_t>(p.batch * sinks), -1);
  for (int64_t b = 0; b < p.batch; ++b) {
    int64_t found = 0;
    for (int64_t j = 0; j < p.nk && found < sinks; ++j)
      if (visible(p, b, j)) index[b * sinks + found++] = j;
  }
  return index;
}

// [B][N]: the keys the estimated parts take (visible, not sinks).
std::vector<uint8_t> estimated_keys(const AttentionParams& p, const std::vector<int64_t>& sinks,
                                    int64_t count) {
  std::vector<uint8_t> keep(static_cast<size_t>(p.batch * p.nk));
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t j = 0; j < p.nk; ++j) keep[b * p.nk + j] = visible(p, b, j) ? 1 : 0;
    for (int64_t t = 0; t < count; ++t) {
      const int64_t j = sinks[b * count + t];
      if (j >= 0) keep[b * p.nk + j] = 0;
    }
  }
  return keep;
}

// A view of rows of t starting at `first`, reversed or not.
const float* view_at(const float* data, const Shape4& st, int64_t first) {
  return data + first * st[2];
}

// The part's view of base: q from origin(0), k and v from key(0), the estimated keys' flags.
AttentionParams part_params(const AttentionParams& base, const Part& part, const uint8_t* keep) {
  AttentionParams p = base;
  const int64_t n = base.nq;
  p.nq = p.nk = part.rows;
  p.q = view_at(base.q, base.q_strides, part.query(n, 0));
  p.k = view_at(base.k, base.k_strides, part.key(n, 0));
  p.v = view_at(base.v, base.v_strides, part.key(n, 0));
  p.mask = keep + part.key(n, 0);
  p.mask_stride_b = n;
  p.mask_stride_n = part.reversed ? -1 : 1;
  if (part.reversed) {
    p.q_strides[2] = -p.q_strides[2];
    p.k_strides[2] = -p.k_strides[2];
    p.v_strides[2] = -p.v_strides[2];
  }
  p.out = nullptr;
  p.out_strides = {p.heads * part.rows * p.dv, part.rows * p.dv, p.dv, 1};
  p.ctx_states = nullptr;
  p.ctx_maxima = nullptr;
  p.ctx_chunk_states = nullptr;
  p.ctx_chunk_maxima = nullptr;
  p.ctx_rows = nullptr;
  p.init_states = nullptr;
  p.init_maxima = nullptr;
  p.final_states = nullptr;
  p.final_maxima = nullptr;
  p.init_distance = nullptr;
  p.part_rows = nullptr;
  p.part_shift = nullptr;
  p.bf16 = false;
  return p;
}

// What every key of query row i shares and the kernel leaves out (kernels::query_log_weight), plus
// the query's decay clock (view row r: the kernel weighs key j by exp(rate j)).
double query_log_weight(const AttentionParams& p, const ResolvedMap& r,
                        const kernels::FeatureParams& fp, int64_t bh, int64_t i, int64_t view_row) {
  const int64_t b = bh / p.heads, h = bh % p.heads;
  const float* qi = p.q + b * p.q_strides[0] + h * p.q_strides[1] + i * p.q_strides[2];
  return kernels::query_log_weight(fp, bh, norm_weight(r, fp),
                                   kernels::squared_norm(qi, fp.d, p.q_strides[3]),
                                   head_log_constant(r, bh), view_row);
}

struct Plan {
  std::vector<int64_t> sinks;
  std::vector<uint8_t> keep;
  std::vector<Part> parts;
};

Plan make_plan(const AttentionParams& base, const AttentionOptions& o) {
  Plan plan;
  plan.sinks = sink_index(base, o.sinks);
  plan.keep = estimated_keys(base, plan.sinks, o.sinks);
  const int64_t n = base.nq;
  // Causal and the prefix: keys up to i - w. The suffix: keys from i + max(w, 1) (with no
  // window the prefix already holds key i).
  const int64_t offsets[2] = {o.window, std::max<int64_t>(o.window, 1)};
  for (int side = 0; side < (o.causal ? 1 : 2); ++side) {
    if (offsets[side] >= n) continue;
    Part part;
    part.reversed = side == 1;
    part.offset = offsets[side];
    part.rows = n - part.offset;
    plan.parts.push_back(std::move(part));
  }
  return plan;
}

// Where a saved context's parts lie (hybrid_context_layout): each part's chunk states,
// their maxima, its rows and their log scales (part[0] the prefix, part[1] a bidirectional
// call's suffix: the plan's parts in order), then the merge's lse and y.
struct SavedPart {
  float* states = nullptr;
  double* maxima = nullptr;
  float* rows = nullptr;
  double* scale = nullptr;
};
struct SavedParts {
  SavedPart part[2];
  double* lse = nullptr;
  float* y = nullptr;
};
SavedParts saved_parts(float* states, double* maxima, float* rows, const HybridContextLayout& l,
                       int64_t heads, int64_t n, int64_t features, int64_t dv) {
  SavedParts at;
  const int64_t slots[2] = {l.slots, l.suffix_slots}, part_rows[2] = {l.part_rows, l.suffix_rows};
  double* lse = maxima + heads * (l.slots + l.suffix_slots);
  double* scale = lse + heads * n;
  for (int q = 0; q < 2; ++q) {
    at.part[q] = {states, maxima, rows, scale};
    states += heads * slots[q] * features * (dv + 1);
    maxima += heads * slots[q];
    rows += heads * part_rows[q] * (dv + 1);
    scale += heads * part_rows[q];
  }
  at.lse = lse;
  at.y = rows;
  return at;
}
// A forward's context, sized for the layout (a fresh one's pages mapped on favor's threads).
SavedParts saved_parts(AttentionContext& c, const HybridContextLayout& l, int64_t heads, int64_t n,
                       int64_t features, int64_t dv) {
  resize_populated(c.states, static_cast<size_t>(l.states));
  resize_populated(c.maxima, static_cast<size_t>(l.maxima));
  resize_populated(c.rows, static_cast<size_t>(l.rows));
  return saved_parts(c.states.data(), c.maxima.data(), c.rows.data(), l, heads, n, features, dv);
}
// (the backward only reads a context's parts)
SavedParts saved_parts(const AttentionContextView& c, const HybridContextLayout& l, int64_t heads,
                       int64_t n, int64_t features, int64_t dv) {
  return saved_parts(const_cast<float*>(c.states), const_cast<double*>(c.maxima),
                     const_cast<float*>(c.rows), l, heads, n, features, dv);
}

HybridContextLayout context_layout(const AttentionParams& base, const AttentionOptions& options) {
  return hybrid_context_layout(base.batch * base.heads, base.nq, base.map.features(), base.dv,
                               options.window, options.causal);
}

// The band's parts: the plan's rows, for the merge (band_attention).
void add_band_parts(kernels::BandParams& bp, const Plan& plan) {
  for (const Part& part : plan.parts) {
    kernels::BandPart& to = bp.parts[bp.part_count++];
    to.data = part.rows_x;
    to.shift = part.shift;
    to.offset = part.offset;
    to.rows = part.rows;
    to.head_stride = part.rows;
    to.reversed = part.reversed;
  }
}

void run_part(const AttentionParams& base, const ResolvedMap& resolved, const Plan& plan,
              Part& part, const SavedPart* saved) {
  const int64_t heads = base.batch * base.heads, dv = base.dv;
  AttentionParams p = part_params(base, part, plan.keep.data());
  if (saved) {
    part.rows_x = saved->rows;
    part.shift = saved->scale;
    p.ctx_chunk_states = saved->states;  // as a causal call saves them (kChunk-token chunks)
    p.ctx_chunk_maxima = saved->maxima;
    p.ctx_rows = saved->rows;
  } else {
    part.own_rows.reset(new float[static_cast<size_t>(heads * part.rows * (dv + 1))]);
    part.own_shift.reset(new double[static_cast<size_t>(heads * part.rows)]);
    part.rows_x = part.own_rows.get();
    part.shift = part.own_shift.get();
  }
  p.out = nullptr;  // the rows are what the merge reads
  p.part_rows = part.rows_x;
  p.part_shift = part.shift;
  kernels::backend().favor_causal(p);
  const kernels::FeatureParams fp = resolved.params();
  const int team = helper_team();
#pragma omp parallel for num_threads(team) schedule(static)
  for (int64_t bh = 0; bh < heads; ++bh)
    for (int64_t r = 0; r < part.rows; ++r) {
      double& s = part.shift[bh * part.rows + r];
      if (!std::isinf(s)) s += query_log_weight(base, resolved, fp, bh, part.query(base.nq, r), r);
    }
  team_ran(team);
}

// Runs the estimated parts' forward: each row's [num | den] and its full log scale, into the
// parts' own arrays or, with a context (`saved`), into it with each part's chunk states.
void run_parts(const AttentionParams& base, const ResolvedMap& resolved, Plan& plan,
               const SavedParts* saved = nullptr) {
  for (size_t q = 0; q < plan.parts.size(); ++q)
    run_part(base, resolved, plan, plan.parts[q], saved ? &saved->part[q] : nullptr);
}

// The exact part's params.
kernels::BandParams band_params(const AttentionParams& base, double scale, bool causal,
                                int64_t window, int64_t sinks, const int64_t* sink_index) {
  kernels::BandParams bp;
  bp.p = base;
  bp.scale = scale;
  bp.causal = causal;
  bp.window = window;
  bp.sinks = sinks;
  bp.sink_index = sink_index;
  return bp;
}
kernels::BandParams band_params(const AttentionParams& base, const ResolvedMap& resolved,
                                const AttentionOptions& o, const Plan& plan) {
  return band_params(base, resolved.scale, o.causal, o.window, o.sinks, plan.sinks.data());
}

// The causal forward with its estimated part: one sweep (kernels::HybridCausalParams); with a
// context, saving it.
int64_t fused_causal(const AttentionParams& base, const ResolvedMap& resolved,
                     const AttentionOptions& options, const Plan& plan, double* lse,
                     AttentionContext* context) {
  const Part& part = plan.parts.front();
  const int64_t heads = base.batch * base.heads;
  const kernels::FeatureParams fp = resolved.params();
  std::vector<double> constant(static_cast<size_t>(heads));
  for (int64_t bh = 0; bh < heads; ++bh) constant[bh] = head_log_constant(resolved, bh);
  kernels::HybridCausalParams hp;
  hp.band = band_params(base, resolved, options, plan);
  hp.band.lse = lse;
  hp.part = part_params(base, part, plan.keep.data());
  hp.offset = part.offset;
  hp.weight.norm = norm_weight(resolved, fp);
  hp.weight.constant = constant.data();
  if (context) {
    const SavedParts at = saved_parts(*context, context_layout(base, options), heads, base.nq,
                                      base.map.features(), base.dv);
    hp.part.ctx_chunk_states = at.part[0].states;
    hp.part.ctx_chunk_maxima = at.part[0].maxima;
    hp.part.ctx_rows = at.part[0].rows;
    hp.band.lse = at.lse;
    hp.saved_y = at.y;
    hp.saved_scale = at.part[0].scale;
    if (base.out == nullptr) {  // a backward's forward: the output is the context's y
      hp.band.p.out = at.y;
      hp.band.p.out_strides = {base.heads * base.nq * base.dv, base.nq * base.dv, base.dv, 1};
    }
  }
  return kernels::backend().hybrid_causal(hp);
}

// A saved context's copy of the merged output (C order), from base.out.
void save_output(const AttentionParams& base, float* y) {
  const int64_t heads = base.batch * base.heads, n = base.nq, dv = base.dv;
  const int team = helper_team();
#pragma omp parallel for num_threads(team) schedule(static)
  for (int64_t bh = 0; bh < heads; ++bh) {
    const float* from = base.out + (bh / base.heads) * base.out_strides[0] +
                        (bh % base.heads) * base.out_strides[1];
    for (int64_t i = 0; i < n; ++i)
      for (int64_t x = 0; x < dv; ++x)
        y[(bh * n + i) * dv + x] = from[i * base.out_strides[2] + x * base.out_strides[3]];
  }
  team_ran(team);
}

// The forward on a plan into base.out (causal, a backward's forward with a context: null,
// the context's y), and lse (B*H x N) where set: causal, one sweep; bidirectional (or no
// estimated part), the parts' rows kept in the plan or the context (run_parts), then the
// exact terms merged with them by the band kernel. With a context (a plan with parts), the
// parts' chunk states and rows, lse and y are saved in it (hybrid_context_layout; its lse
// then, not `lse`, which its callers leave null).
int64_t merge_forward(const AttentionParams& base, const ResolvedMap& resolved,
                      const AttentionOptions& options, Plan& plan, double* lse,
                      AttentionContext* context = nullptr) {
  if (options.causal && !plan.parts.empty())
    return fused_causal(base, resolved, options, plan, lse, context);
  SavedParts at;
  if (context)
    at = saved_parts(*context, context_layout(base, options), base.batch * base.heads, base.nq,
                     base.map.features(), base.dv);
  run_parts(base, resolved, plan, context ? &at : nullptr);
  kernels::BandParams bp = band_params(base, resolved, options, plan);
  add_band_parts(bp, plan);
  bp.lse = context ? at.lse : lse;
  const int64_t zero_rows = kernels::backend().band_attention(bp);
  if (context) save_output(base, at.y);
  return zero_rows;
}

// The merged rows of a backward: y (C order) and lse, recomputed or saved.
struct Merged {
  const float* y;
  const double* lse;
};

// An estimated part's rows [B*H][rows][Dv + 1] and their full log scales [B*H][rows].
struct PartRows {
  const float* rows;
  const double* shift;
};

// The estimated part's log scale holds the query's norm term (+-scale |q_i|^2 / 2), which
// the kernel's backward treats as a constant (it cancels in a plain call, not here):
// dL/dq_i += (dL/dL_i) d(norm term)/dq_i with dL/dL_i = e^(L_i - lse_i) (dy_i . num_i -
// (dy_i . y_i) den_i), the row's share in the merge times how it moves the output.
void add_norm_term_grad(const BackwardParams& bp, const ResolvedMap& resolved, const Part& part,
                        const PartRows& rows_of, const Merged& merged) {
  const AttentionParams& base = bp.fwd;
  const kernels::FeatureParams fp = resolved.params();
  if (fp.key_norm == kernels::KeyNorm::none) return;
  const double sign = fp.key_norm == kernels::KeyNorm::minus_half ? -1.0 : 1.0;
  const int64_t n = base.nq, heads = base.batch * base.heads, d = base.d, dv = base.dv;
  const int team = helper_team();
#pragma omp parallel for num_threads(team) schedule(static)
  for (int64_t bh = 0; bh < heads; ++bh) {
    const int64_t b = bh / base.heads, h = bh % base.heads;
    for (int64_t r = 0; r < part.rows; ++r) {
      const int64_t i = part.query(n, r);
      const double L = rows_of.shift[bh * part.rows + r], lse = merged.lse[bh * n + i];
      if (std::isinf(L) || std::isinf(lse)) continue;
      const float* row = rows_of.rows + (bh * part.rows + r) * (dv + 1);
      const float* y = merged.y + (bh * n + i) * dv;
      const float* dy = bp.dy + b * bp.dy_strides[0] + h * bp.dy_strides[1] + i * bp.dy_strides[2];
      double g_num = 0.0, g_y = 0.0;
      for (int64_t x = 0; x < dv; ++x) {
        const double g = dy[x * bp.dy_strides[3]];
        g_num += g * row[x];
        g_y += g * y[x];
      }
      const double dl = std::exp(L - lse) * (g_num - g_y * row[dv]);
      const float* qi =
          base.q + b * base.q_strides[0] + h * base.q_strides[1] + i * base.q_strides[2];
      float* dq = bp.dq + (bh * n + i) * d;
      for (int64_t x = 0; x < d; ++x)
        dq[x] += static_cast<float>(dl * sign * resolved.scale * qi[x * base.q_strides[3]]);
    }
  }
  team_ran(team);
}

}  // namespace

double norm_weight(const ResolvedMap& r, const kernels::FeatureParams& fp) {
  return fp.key_norm == kernels::KeyNorm::minus_half  ? -0.5 * r.scale
         : fp.key_norm == kernels::KeyNorm::plus_half ? 0.5 * r.scale
                                                      : 0.0;
}

double head_log_constant(const ResolvedMap& r, int64_t bh) {
  // the features' constant on both sides: m^-1/2 (positive, trig), (2m)^-1/2 (hyperbolic),
  // 1 (hedgehog), FAVOR++ / FAVOR#'s per head from their fit
  if (r.adapted.heads > 0) return 2.0 * r.adapted.log_const[bh % r.adapted.heads];  // by set
  return 2.0 * feature_log_constant(r.kernel, r.m);
}

int64_t hybrid_forward(const AttentionParams& base, const ResolvedMap& resolved,
                       const AttentionOptions& options, AttentionContext* context) {
  Plan plan = make_plan(base, options);
  if (context && plan.parts.empty()) {  // no estimated part: saves nothing
    *context = AttentionContext{};
    context = nullptr;
  }
  return merge_forward(base, resolved, options, plan, nullptr, context);
}

void hybrid_backward(const BackwardParams& bp, const ResolvedMap& resolved,
                     const AttentionOptions& options, const AttentionContextView* context) {
  const AttentionParams& base = bp.fwd;
  const int64_t n = base.nq, heads = base.batch * base.heads, d = base.d, dv = base.dv;
  Plan plan = make_plan(base, options);
  // The merged rows and each part's rows: from the context, or recomputed (causal with a
  // part: the forward saving a context here, the same sweep and the same backward; a
  // bidirectional one keeps its parts' rows only, and each part's backward reruns its sweep:
  // docs/performance.md, "Bidirectional hybrid: the saved context").
  std::vector<float> y_store;
  std::vector<double> lse_store;
  Merged merged{};
  std::vector<PartRows> part_rows;
  SavedParts saved{};
  AttentionContext local;
  AttentionContextView local_view;
  if (!context && options.causal && !plan.parts.empty()) {
    AttentionParams fwd = base;
    fwd.out = nullptr;  // into the context's y
    merge_forward(fwd, resolved, options, plan, nullptr, &local);
    local_view = local.view();
    context = &local_view;
  }
  if (context) {
    saved = saved_parts(*context, context_layout(base, options), heads, n, base.map.features(), dv);
    merged = {saved.y, saved.lse};
    for (size_t q = 0; q < plan.parts.size(); ++q)
      part_rows.push_back({saved.part[q].rows, saved.part[q].scale});
  } else {
    y_store.resize(static_cast<size_t>(heads * n * dv));
    lse_store.resize(static_cast<size_t>(heads * n));
    AttentionParams fwd = base;
    fwd.out = y_store.data();
    fwd.out_strides = {base.heads * n * dv, n * dv, dv, 1};
    merge_forward(fwd, resolved, options, plan, lse_store.data());
    merged = {y_store.data(), lse_store.data()};
    for (const Part& part : plan.parts) part_rows.push_back({part.rows_x, part.shift});
  }

  // The prefix part first: its kernel writes (not adds) its rows of dq, dk and dv, in place
  // (query i = r + offset, key j = r, with the call's rows per head); then the band and the
  // suffix part add theirs.
  const kernels::FeatureParams fp = resolved.params();
  auto part_backward = [&](size_t q) {
    const Part& part = plan.parts[q];
    const PartRows& rows_of = part_rows[q];
    const int64_t rows = part.rows;
    const bool in_place = !part.reversed;
    // The merged rows in the view's order, lse in the kernel's frame (its row scales c + M).
    std::vector<float> y(in_place ? 0 : static_cast<size_t>(heads * rows * dv));
    std::vector<double> lse(static_cast<size_t>(heads * (in_place ? n : rows)));
    const int team = helper_team();
#pragma omp parallel for num_threads(team) schedule(static)
    for (int64_t bh = 0; bh < heads; ++bh)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = part.query(n, r);
        if (!in_place)
          std::copy_n(merged.y + (bh * n + i) * dv, dv, y.data() + (bh * rows + r) * dv);
        const double l = merged.lse[bh * n + i];
        lse[in_place ? bh * n + i : bh * rows + r] =
            std::isinf(l) ? l : l - query_log_weight(base, resolved, fp, bh, i, r);
      }
    team_ran(team);
    BackwardParams lb = bp;
    lb.fwd = part_params(base, part, plan.keep.data());
    lb.dy = view_at(bp.dy, bp.dy_strides, part.query(n, 0));
    if (part.reversed) lb.dy_strides[2] = -lb.dy_strides[2];
    std::vector<float> dq, dk, dvv;
    if (in_place) {
      lb.dq = bp.dq + part.offset * d;
      lb.dk = bp.dk;
      lb.dv = bp.dv;
      lb.merged_y = merged.y + part.offset * dv;
      lb.merged_lse = lse.data() + part.offset;
      lb.head_rows = n;
    } else {
      dq.resize(static_cast<size_t>(heads * rows * d));
      dk.resize(static_cast<size_t>(heads * rows * d));
      dvv.resize(static_cast<size_t>(heads * rows * dv));
      lb.dq = dq.data();
      lb.dk = dk.data();
      lb.dv = dvv.data();
      lb.merged_y = y.data();
      lb.merged_lse = lse.data();
    }
    lb.ctx_states = nullptr;
    lb.ctx_maxima = nullptr;
    lb.ctx_chunk_states = context ? saved.part[q].states : nullptr;
    lb.ctx_chunk_maxima = context ? saved.part[q].maxima : nullptr;
    lb.ctx_rows = context ? saved.part[q].rows : nullptr;
    lb.r_out = nullptr;
    lb.r_in = nullptr;
    kernels::backend().favor_backward_causal(lb);
    add_norm_term_grad(bp, resolved, part, rows_of, merged);
    if (in_place) return;
    const int add_team = helper_team();
#pragma omp parallel for num_threads(add_team) schedule(static)
    for (int64_t bh = 0; bh < heads; ++bh)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = part.query(n, r), j = part.key(n, r);
        for (int64_t x = 0; x < d; ++x) {
          bp.dq[(bh * n + i) * d + x] += dq[(bh * rows + r) * d + x];
          bp.dk[(bh * n + j) * d + x] += dk[(bh * rows + r) * d + x];
        }
        for (int64_t x = 0; x < dv; ++x)
          bp.dv[(bh * n + j) * dv + x] += dvv[(bh * rows + r) * dv + x];
      }
    team_ran(add_team);
  };
  for (size_t q = 0; q < plan.parts.size(); ++q)
    if (!plan.parts[q].reversed) part_backward(q);

  kernels::BandBackwardParams band;
  band.band = band_params(base, resolved, options, plan);
  band.dy = bp.dy;
  band.dy_strides = bp.dy_strides;
  band.merged_y = merged.y;
  band.merged_lse = merged.lse;
  band.dq = bp.dq;
  band.dk = bp.dk;
  band.dv = bp.dv;
  kernels::backend().band_attention_backward(band);

  for (size_t q = 0; q < plan.parts.size(); ++q)
    if (plan.parts[q].reversed) part_backward(q);
}

void window_forward(const AttentionParams& base, double scale, bool causal, int64_t window,
                    int64_t sinks, double* lse) {
  const std::vector<int64_t> sink = sink_index(base, sinks);
  kernels::BandParams bp = band_params(base, scale, causal, window, sinks, sink.data());
  bp.lse = lse;
  kernels::backend().band_attention(bp);
}

void window_backward(const BackwardParams& bp, double scale, bool causal, int64_t window,
                     int64_t sinks, const float* saved_y, const double* saved_lse) {
  const AttentionParams& base = bp.fwd;
  const int64_t n = base.nq, heads = base.batch * base.heads, dv = base.dv;
  std::vector<float> y;
  std::vector<double> lse;
  if (!saved_y || !saved_lse) {  // recompute them
    y.resize(static_cast<size_t>(heads * n * dv));
    lse.resize(static_cast<size_t>(heads * n));
    AttentionParams fwd = base;
    fwd.out = y.data();
    fwd.out_strides = {base.heads * n * dv, n * dv, dv, 1};
    window_forward(fwd, scale, causal, window, sinks, lse.data());
    saved_y = y.data();
    saved_lse = lse.data();
  }
  const std::vector<int64_t> sink = sink_index(base, sinks);
  kernels::BandBackwardParams band;
  band.band = band_params(base, scale, causal, window, sinks, sink.data());
  band.dy = bp.dy;
  band.dy_strides = bp.dy_strides;
  band.merged_y = saved_y;
  band.merged_lse = saved_lse;
  band.dq = bp.dq;
  band.dk = bp.dk;
  band.dv = bp.dv;
  kernels::backend().band_attention_backward(band);
}

}  // namespace favor::detail
