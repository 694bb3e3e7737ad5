// The exact part of hybrid attention, per (batch, head), in tiles of kTile queries: for query
// i the keys E(i) = its window plus the batch row's sinks (visible keys only; causal:
// j <= i), scores s_ij = scale q_i . k_j.
//   The tile's window keys are one contiguous range (the union of its rows' windows: at
//   most kTile + w - 1 keys causal, kTile + 2w - 2 bidirectional), its sinks a gathered
//   block of at most s rows; each is one GEMM for the scores and one for P V, and the rows
//   mask what is not theirs (-inf).
//   Forward: [sum exp(s_ij - M_i) v_j | sum exp(s_ij - M_i)] and M_i.
//   Backward, from the merged row (y_i, lse_i): P_ij = exp(s_ij - lse_i), dv_j += P_ij dy_i,
//   ds_ij = P_ij (dy_i . v_j - dy_i . y_i), dq_i += scale ds_ij k_j, dk_j += scale ds_ij q_i
//   (the same GEMMs transposed).
// A head's rows are gathered once (memory O(N (D + Dv)) per thread).
#include "cpu/band_attention.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/blas.hpp"
#include "cpu/schedule.hpp"
#include "cpu/vec_math.hpp"

namespace favor::cpu {
namespace {

using kernels::BandBackwardParams;
using kernels::BandParams;

constexpr int64_t kTile = 64;

// The keys of a tile of queries [t0, t0 + rows): the window range [lo, hi] (empty when
// window is 0) and the sinks outside some row's window, gathered.
struct TileKeys {
  int64_t lo = 0, count = 0;  // window keys lo .. lo + count - 1
  std::vector<int64_t> sinks;
};

struct Workspace {
  std::vector<float> q, k, v, dy, y;  // the head's rows; the tile's dy and merged y
  std::vector<float> s, ss;           // scores: window [kTile][span], sinks [kTile][sinks]
  std::vector<float> ks, vs;          // the sinks' keys and values, gathered
  std::vector<float> dp, dps, g;      // backward: dP (window, sinks), scratch
  std::vector<float> dks, dvs;        // backward: the sinks' dk, dv of the tile
  int64_t span;
  Workspace(int64_t n, int64_t d, int64_t dv, int64_t span_, int64_t sinks)
      : q(n * d),
        k(n * d),
        v(n * dv),
        dy(kTile * dv),
        y(kTile * dv),
        s(kTile * span_),
        ss(kTile * std::max<int64_t>(sinks, 1)),
        ks(std::max<int64_t>(sinks, 1) * d),
        vs(std::max<int64_t>(sinks, 1) * dv),
        dp(kTile * span_),
        dps(kTile * std::max<int64_t>(sinks, 1)),
        g(kTile * std::max(d, dv)),
        dks(std::max<int64_t>(sinks, 1) * d),
        dvs(std::max<int64_t>(sinks, 1) * dv),
        span(span_) {}
};

// Keys per tile at most: the union of its rows' windows.
int64_t span_of(const BandParams& bp) {
  if (bp.window == 0) return 1;
  return std::min(bp.p.nk, kTile + (bp.causal ? 1 : 2) * (bp.window - 1));
}

void gather(const float* base, const Shape4& st, int64_t b, int64_t h, int64_t n, int64_t d,
            float* dst) {
  const float* head = base + b * st[0] + h * st[1];
  for (int64_t r = 0; r < n; ++r)
    for (int64_t x = 0; x < d; ++x) dst[r * d + x] = head[r * st[2] + x * st[3]];
}

bool visible(const kernels::AttentionParams& p, int64_t b, int64_t j) {
  return p.mask == nullptr || p.mask[b * p.mask_stride_b + j * p.mask_stride_n] != 0;
}

// Whether key j is in query i's window.
bool in_window(const BandParams& bp, int64_t i, int64_t j) {
  return i - j < bp.window && (bp.causal ? j <= i : j - i < bp.window);
}

TileKeys tile_keys(const BandParams& bp, int64_t b, int64_t t0, int64_t rows) {
  TileKeys t;
  const int64_t last = t0 + rows - 1;
  if (bp.window > 0) {
    t.lo = std::max<int64_t>(0, t0 - bp.window + 1);
    const int64_t hi = bp.causal ? last : std::min(bp.p.nk - 1, last + bp.window - 1);
    t.count = hi - t.lo + 1;
  }
  for (int64_t u = 0; u < bp.sinks; ++u) {
    const int64_t j = bp.sink_index[b * bp.sinks + u];
    if (j < 0) break;
    // every sink some row may see (tile_scores masks, per row, those in its window)
    if (!(bp.causal && j > last)) t.sinks.push_back(j);
  }
  return t;
}

// The tile's scores, masked: window block ws.s [rows][t.count] and sink block ws.ss
// [rows][sinks]; -inf where the key is not the row's.
void tile_scores(const BandParams& bp, int64_t b, int64_t t0, int64_t rows, const TileKeys& t,
                 Workspace& ws) {
  const kernels::AttentionParams& p = bp.p;
  const int64_t d = p.d, ns = static_cast<int64_t>(t.sinks.size());
  const auto scale = static_cast<float>(bp.scale);
  const float* qt = ws.q.data() + t0 * d;
  if (t.count > 0) {
    gemm(false, true, rows, t.count, d, scale, qt, d, ws.k.data() + t.lo * d, d, 0.0f, ws.s.data(),
         t.count);
    for (int64_t r = 0; r < rows; ++r) {
      float* row = ws.s.data() + r * t.count;
      for (int64_t c = 0; c < t.count; ++c) {
        const int64_t j = t.lo + c;
        if (!in_window(bp, t0 + r, j) || !visible(p, b, j)) row[c] = -INFINITY;
      }
    }
  }
  if (ns > 0) {
    for (int64_t u = 0; u < ns; ++u)
      std::copy_n(ws.k.data() + t.sinks[u] * d, d, ws.ks.data() + u * d);
    gemm(false, true, rows, ns, d, scale, qt, d, ws.ks.data(), d, 0.0f, ws.ss.data(), ns);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t u = 0; u < ns; ++u) {
        const int64_t i = t0 + r, j = t.sinks[u];
        if (in_window(bp, i, j) || (bp.causal && j > i)) ws.ss[r * ns + u] = -INFINITY;
      }
  }
}

// Head (b, h)'s q, k and v rows into the workspace, contiguous.
void load_head(const kernels::AttentionParams& p, int64_t b, int64_t h, Workspace& ws) {
  gather(p.q, p.q_strides, b, h, p.nq, p.d, ws.q.data());
  gather(p.k, p.k_strides, b, h, p.nk, p.d, ws.k.data());
  gather(p.v, p.v_strides, b, h, p.nk, p.dv, ws.v.data());
}

// exp(x - shift) in place over n entries (-inf -> 0).
void exp_shift(float* x, int64_t n, float shift) {
  for (int64_t c = 0; c < n; ++c) x[c] = std::isinf(x[c]) ? 0.0f : std::exp(x[c] - shift);
}

}  // namespace

void band_forward(const BandParams& bp, const Config& config) {
  const kernels::AttentionParams& p = bp.p;
  const int64_t d = p.d, dv = p.dv, ld = dv + 1, span = span_of(bp);
  const double flops =
      double(p.batch * p.heads * p.nq) * double(span + bp.sinks) * (2.0 * (d + dv));
  const Schedule plan = heads_only(p.batch * p.heads, config.threads, flops);
  auto spaces = make_workspaces<Workspace>(plan.team, p.nk, d, dv, span, bp.sinks);
  for_each_head(plan, spaces, [&](int64_t bh, Workspace& ws) {
    const int64_t b = bh / p.heads, h = bh % p.heads;
    load_head(p, b, h, ws);
    for (int64_t t0 = 0; t0 < p.nq; t0 += kTile) {
      const int64_t rows = std::min(kTile, p.nq - t0);
      const TileKeys t = tile_keys(bp, b, t0, rows);
      const int64_t ns = static_cast<int64_t>(t.sinks.size());
      tile_scores(bp, b, t0, rows, t, ws);
      float* out = p.part_rows + (bh * p.nq + t0) * ld;
      for (int64_t r = 0; r < rows; ++r) {
        float* sw = ws.s.data() + r * t.count;
        float* sk = ws.ss.data() + r * ns;
        float top = t.count > 0 ? max_value(sw, t.count) : -INFINITY;
        if (ns > 0) top = std::max(top, max_value(sk, ns));
        p.part_shift[bh * p.nq + t0 + r] = top;
        if (std::isinf(top)) {  // no exact key: the row's sums are zero
          std::fill(sw, sw + t.count, 0.0f);
          std::fill(sk, sk + ns, 0.0f);
          continue;
        }
        exp_shift(sw, t.count, top);
        exp_shift(sk, ns, top);
      }
      // [num | den]: P V over the window and the sinks, and the row sums
      for (int64_t r = 0; r < rows; ++r) {
        float* row = out + r * ld;
        const float* sw = ws.s.data() + r * t.count;
        const float* sk = ws.ss.data() + r * ns;
        float den = 0.0f;
        for (int64_t c = 0; c < t.count; ++c) den += sw[c];
        for (int64_t u = 0; u < ns; ++u) den += sk[u];
        row[dv] = den;
      }
      if (t.count > 0) {
        gemm(false, false, rows, dv, t.count, 1.0f, ws.s.data(), t.count, ws.v.data() + t.lo * dv,
             dv, 0.0f, out, ld);
      } else {
        for (int64_t r = 0; r < rows; ++r) std::fill(out + r * ld, out + r * ld + dv, 0.0f);
      }
      if (ns > 0) {
        for (int64_t u = 0; u < ns; ++u)
          std::copy_n(ws.v.data() + t.sinks[u] * dv, dv, ws.vs.data() + u * dv);
        gemm(false, false, rows, dv, ns, 1.0f, ws.ss.data(), ns, ws.vs.data(), dv, 1.0f, out, ld);
      }
    }
    return int64_t{0};
  });
}

void band_backward(const BandBackwardParams& g, const Config& config) {
  const BandParams& bp = g.band;
  const kernels::AttentionParams& p = bp.p;
  const int64_t d = p.d, dv = p.dv, span = span_of(bp);
  const double flops =
      double(p.batch * p.heads * p.nq) * double(span + bp.sinks) * (4.0 * (d + dv));
  const Schedule plan = heads_only(p.batch * p.heads, config.threads, flops);
  auto spaces = make_workspaces<Workspace>(plan.team, p.nk, d, dv, span, bp.sinks);
  for_each_head(plan, spaces, [&](int64_t bh, Workspace& ws) {
    const int64_t b = bh / p.heads, h = bh % p.heads;
    load_head(p, b, h, ws);
    const auto scale = static_cast<float>(bp.scale);
    float* dq = g.dq + bh * p.nq * d;
    float* dk = g.dk + bh * p.nk * d;
    float* dvh = g.dv + bh * p.nk * dv;
    const float* dyh = g.dy + b * g.dy_strides[0] + h * g.dy_strides[1];
    for (int64_t t0 = 0; t0 < p.nq; t0 += kTile) {
      const int64_t rows = std::min(kTile, p.nq - t0);
      const TileKeys t = tile_keys(bp, b, t0, rows);
      const int64_t ns = static_cast<int64_t>(t.sinks.size());
      if (t.count == 0 && ns == 0) continue;
      tile_scores(bp, b, t0, rows, t, ws);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = t0 + r;
        for (int64_t x = 0; x < dv; ++x)
          ws.dy[r * dv + x] = dyh[i * g.dy_strides[2] + x * g.dy_strides[3]];
        std::copy_n(g.merged_y + (bh * p.nq + i) * dv, dv, ws.y.data() + r * dv);
        const double lse = g.merged_lse[bh * p.nq + i];
        float* sw = ws.s.data() + r * t.count;
        float* sk = ws.ss.data() + r * ns;
        if (std::isinf(lse)) {  // a zero row passes no gradient
          std::fill(sw, sw + t.count, 0.0f);
          std::fill(sk, sk + ns, 0.0f);
          continue;
        }
        // P = exp(s - lse) in double for the shift (lse may exceed float's exponent range
        // of the difference only by rounding)
        for (int64_t c = 0; c < t.count; ++c)
          sw[c] = std::isinf(sw[c]) ? 0.0f : static_cast<float>(std::exp(double(sw[c]) - lse));
        for (int64_t u = 0; u < ns; ++u)
          sk[u] = std::isinf(sk[u]) ? 0.0f : static_cast<float>(std::exp(double(sk[u]) - lse));
      }
      // dP = dY V^T, then dS = scale P (dP - dy . y) in dp / dps
      if (t.count > 0)
        gemm(false, true, rows, t.count, dv, 1.0f, ws.dy.data(), dv, ws.v.data() + t.lo * dv, dv,
             0.0f, ws.dp.data(), t.count);
      if (ns > 0) {
        for (int64_t u = 0; u < ns; ++u) {
          std::copy_n(ws.v.data() + t.sinks[u] * dv, dv, ws.vs.data() + u * dv);
          std::copy_n(ws.k.data() + t.sinks[u] * d, d, ws.ks.data() + u * d);
        }
        gemm(false, true, rows, ns, dv, 1.0f, ws.dy.data(), dv, ws.vs.data(), dv, 0.0f,
             ws.dps.data(), ns);
      }
      for (int64_t r = 0; r < rows; ++r) {
        const float delta = dot(ws.dy.data() + r * dv, ws.y.data() + r * dv, dv);
        for (int64_t c = 0; c < t.count; ++c) {
          float& x = ws.dp[r * t.count + c];
          x = scale * ws.s[r * t.count + c] * (x - delta);
        }
        for (int64_t u = 0; u < ns; ++u) {
          float& x = ws.dps[r * ns + u];
          x = scale * ws.ss[r * ns + u] * (x - delta);
        }
      }
      const float* qt = ws.q.data() + t0 * d;
      if (t.count > 0) {
        // dq_t += dS K_win; dk_win += dS^T q_t; dv_win += P^T dy_t
        gemm(false, false, rows, d, t.count, 1.0f, ws.dp.data(), t.count, ws.k.data() + t.lo * d, d,
             1.0f, dq + t0 * d, d);
        gemm(true, false, t.count, d, rows, 1.0f, ws.dp.data(), t.count, qt, d, 1.0f, dk + t.lo * d,
             d);
        gemm(true, false, t.count, dv, rows, 1.0f, ws.s.data(), t.count, ws.dy.data(), dv, 1.0f,
             dvh + t.lo * dv, dv);
      }
      if (ns > 0) {
        gemm(false, false, rows, d, ns, 1.0f, ws.dps.data(), ns, ws.ks.data(), d, 1.0f, dq + t0 * d,
             d);
        gemm(true, false, ns, d, rows, 1.0f, ws.dps.data(), ns, qt, d, 0.0f, ws.dks.data(), d);
        gemm(true, false, ns, dv, rows, 1.0f, ws.ss.data(), ns, ws.dy.data(), dv, 0.0f,
             ws.dvs.data(), dv);
        for (int64_t u = 0; u < ns; ++u) {
          const int64_t j = t.sinks[u];
          for (int64_t x = 0; x < d; ++x) dk[j * d + x] += ws.dks[u * d + x];
          for (int64_t x = 0; x < dv; ++x) dvh[j * dv + x] += ws.dvs[u * dv + x];
        }
      }
    }
    return int64_t{0};
  });
}

}  // namespace favor::cpu
