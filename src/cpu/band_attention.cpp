// The exact part of hybrid attention, per (batch, head), in tiles of kBandTile queries: for query
// i the keys E(i) = its window plus the batch row's sinks (visible keys only; causal:
// j <= i), scores s_ij = scale q_i . k_j.
//   The tile's window keys are one contiguous range (the union of its rows' windows: at
//   most kBandTile + w - 1 keys causal, kBandTile + 2w - 2 bidirectional), its sinks a gathered
//   block of at most s rows; each is one product for the scores and one for P V, and the
//   rows mask what is not theirs (-inf). The products are small_gemm's (cpu/small_gemm.hpp:
//   in registers, no packing; OpenBLAS's packing cost as much as the product at these sizes),
//   over groups of 16 rows (or keys) that skip the keys (rows) outside the group's windows,
//   whose weights are exact zeros (keys_by_rows and the two below it); the row max, exp and
//   score gradient run down the tile's columns (cpu/vec_math.hpp columns_*).
//   Forward: [sum exp(s_ij - M_i) v_j | sum exp(s_ij - M_i)] and M_i, merged in the tile
//   with the estimated parts' rows (kernels/band_params.hpp) into y_i and lse_i.
//   Backward, from the merged row (y_i, lse_i): P_ij = exp(s_ij - lse_i), dv_j += P_ij dy_i,
//   ds_ij = P_ij (dy_i . v_j - dy_i . y_i), dq_i += scale ds_ij k_j, dk_j += scale ds_ij q_i
//   (the same GEMMs transposed).
// Rows are read in place when their features are contiguous, else gathered per tile:
// memory O(kBandTile (w + s) + (kBandTile + w) (D + Dv)) per thread, lent between calls.
#include "cpu/band_attention.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/schedule.hpp"
#include "cpu/small_gemm.hpp"
#include "cpu/vec_math.hpp"

namespace favor::cpu {
namespace {

using kernels::BandBackwardParams;
using kernels::BandParams;

// The keys of a tile of queries [t0, t0 + rows): the window range [lo, hi] (empty when
// window is 0) and the sinks outside some row's window, gathered.
struct TileKeys {
  int64_t lo = 0, count = 0;       // window keys lo .. lo + count - 1
  const int64_t* sinks = nullptr;  // the batch row's first `ns` sinks (ascending)
  int64_t ns = 0;
};

// Rows [first, first + count) of head (b, h) of a [B, H, N, X] view as a row-major matrix:
// the view itself when its features are contiguous, else gathered into buf.
struct Rows {
  const float* data;
  int64_t ld;
  const float* row(int64_t r) const { return data + r * ld; }
};
Rows rows_of(const float* base, const Shape4& st, int64_t b, int64_t h, int64_t first,
             int64_t count, int64_t x, float* buf) {
  const float* at = base + b * st[0] + h * st[1] + first * st[2];
  if (st[3] == 1 && st[2] >= x) return {at, st[2]};
  for (int64_t r = 0; r < count; ++r)
    for (int64_t c = 0; c < x; ++c) buf[r * x + c] = at[r * st[2] + c * st[3]];
  return {buf, x};
}

// Keys per tile at most: the union of its rows' windows.
int64_t span_of(const BandParams& bp) {
  if (bp.window == 0) return 1;
  return std::min(bp.p.nk, kBandTile + (bp.causal ? 1 : 2) * (bp.window - 1));
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
  // every sink some row may see (the rows mask those in their window): sink_index ascends,
  // so these are its first
  t.sinks = bp.sink_index + b * bp.sinks;
  while (t.ns < bp.sinks && t.sinks[t.ns] >= 0 && !(bp.causal && t.sinks[t.ns] > last)) ++t.ns;
  return t;
}

// Row r's window keys within the tile's range: columns [lo, hi) of ws.s (empty without a
// window).
struct Columns {
  int64_t lo, hi;
};
Columns window_columns(const BandParams& bp, const TileKeys& t, int64_t i) {
  if (t.count == 0) return {0, 0};
  const int64_t first = std::max<int64_t>(0, i - bp.window + 1);
  const int64_t last = bp.causal ? i : std::min(bp.p.nk - 1, i + bp.window - 1);
  const int64_t lo = std::clamp<int64_t>(first - t.lo, 0, t.count);
  return {lo, std::clamp<int64_t>(last - t.lo + 1, lo, t.count)};
}

// The products below run over groups of kGroup rows (or keys) of a tile: rows [ra, rb) see
// window columns [cols[ra].lo, cols[rb - 1].hi) at most, and keys [ca, cb) are seen by rows
// [first row whose hi > ca, last row whose lo < cb] (window_columns is monotone in the row,
// both bounds). Outside those spans every score is -inf and every weight 0, so a group's
// product skips them: a causal tile of 32 queries at w = 64 has 95 keys, of which each group
// of 16 rows sees 79 (bidirectional 158 and 142). The skipped terms are exact zeros, so the
// sums are the same as over the whole tile.
constexpr int64_t kGroup = 16;
struct Span {
  int64_t a, b;
};
Span keys_of_rows(const Columns* cols, int64_t ra, int64_t rb) {
  return {cols[ra].lo, std::max(cols[ra].lo, cols[rb - 1].hi)};
}
Span rows_of_keys(const Columns* cols, int64_t rows, int64_t ca, int64_t cb) {
  int64_t ra = 0, rb = rows;
  while (ra < rows && cols[ra].hi <= ca) ++ra;
  while (rb > ra && cols[rb - 1].lo >= cb) --rb;
  return {ra, rb};
}

// C [count][rows] (row stride rows) = alpha A B^T over the window's keys, A [count][K] (lda)
// and B^T given as [K][rows] (row stride rows): per group of rows, only its keys' rows of C
// are written.
void keys_by_rows(const Columns* cols, int64_t rows, int64_t K, float alpha, const float* A,
                  int64_t lda, const float* Bt, float* C) {
  for (int64_t ra = 0; ra < rows; ra += kGroup) {
    const int64_t rb = std::min(rows, ra + kGroup);
    const Span k = keys_of_rows(cols, ra, rb);
    small_gemm(false, k.b - k.a, rb - ra, K, alpha, A + k.a * lda, lda, Bt + ra, rows, 0.0f,
               C + k.a * rows + ra, rows);
  }
}

// C [rows][N] (ldc) = P B + beta C, P given as P^T [count][rows] (rows) and B [count][N]
// (ldb): per group of rows, the sum over its keys only.
void rows_by_keys(const Columns* cols, int64_t rows, int64_t N, const float* Pt, const float* B,
                  int64_t ldb, float beta, float* C, int64_t ldc) {
  for (int64_t ra = 0; ra < rows; ra += kGroup) {
    const int64_t rb = std::min(rows, ra + kGroup);
    const Span k = keys_of_rows(cols, ra, rb);
    small_gemm(true, rb - ra, N, k.b - k.a, 1.0f, Pt + k.a * rows + ra, rows, B + k.a * ldb, ldb,
               beta, C + ra * ldc, ldc);
  }
}

// C [count][N] (ldc) += X^T B over the tile's rows, X^T given as [count][rows] (rows) and B
// [rows][N] (ldb): per group of keys, the sum over the rows that see them only.
void keys_by_tile_rows(const Columns* cols, int64_t count, int64_t rows, int64_t N, const float* Xt,
                       const float* B, int64_t ldb, float* C, int64_t ldc) {
  for (int64_t ca = 0; ca < count; ca += kGroup) {
    const int64_t cb = std::min(count, ca + kGroup);
    const Span r = rows_of_keys(cols, rows, ca, cb);
    small_gemm(false, cb - ca, N, r.b - r.a, 1.0f, Xt + ca * rows + r.a, rows, B + r.a * ldb, ldb,
               1.0f, C + ca * ldc, ldc);
  }
}

// The tile's rows of q, k and v (the window's keys), read in place or gathered.
struct TileRows {
  Rows q, k, v;
};
TileRows tile_rows(const kernels::AttentionParams& p, int64_t b, int64_t h, int64_t t0,
                   int64_t rows, const TileKeys& t, BandWorkspace& ws) {
  return {rows_of(p.q, p.q_strides, b, h, t0, rows, p.d, ws.q.data()),
          rows_of(p.k, p.k_strides, b, h, t.lo, t.count, p.d, ws.k.data()),
          rows_of(p.v, p.v_strides, b, h, t.lo, t.count, p.dv, ws.v.data())};
}

// The sinks' keys and values into ws.ks, ws.vs.
void gather_sinks(const kernels::AttentionParams& p, int64_t b, int64_t h, const TileKeys& t,
                  BandWorkspace& ws) {
  for (int64_t u = 0; u < t.ns; ++u) {
    const int64_t j = t.sinks[u];
    const float* k = p.k + b * p.k_strides[0] + h * p.k_strides[1] + j * p.k_strides[2];
    const float* v = p.v + b * p.v_strides[0] + h * p.v_strides[1] + j * p.v_strides[2];
    for (int64_t x = 0; x < p.d; ++x) ws.ks[u * p.d + x] = k[x * p.k_strides[3]];
    for (int64_t x = 0; x < p.dv; ++x) ws.vs[u * p.dv + x] = v[x * p.v_strides[3]];
  }
}

// y = sum_u e^(L_u - S) num_u / sum_u e^(L_u - S) den_u over `used` rows [num | den] (dv + 1
// floats) at log scales L_u (-inf: none), S = max_u L_u, into y (at stride; through tmp, dv
// floats, when not 1), the factors and the denominator in double; *lse = S + log den. false
// for a zero row (no part, a denominator not > 0, a non-finite y): y = 0, *lse = -inf.
bool merge_parts(const float* const* rows, const double* scales, int used, int64_t dv, float* y,
                 int64_t stride, float* tmp, double* lse) {
  double S = -INFINITY;
  for (int u = 0; u < used; ++u) S = std::max(S, scales[u]);
  bool ok = !std::isinf(S);
  float f[3] = {0.0f, 0.0f, 0.0f};
  double den = 0.0;
  for (int u = 0; ok && u < used; ++u) {
    if (std::isinf(scales[u])) continue;
    const double e = std::exp(scales[u] - S);
    f[u] = static_cast<float>(e);
    den += e * double(rows[u][dv]);
  }
  ok = ok && den > 0.0 && std::isfinite(den);
  if (ok) {
    // y = sum_u (f_u / den) num_u, in place when contiguous; a non-finite entry makes the
    // sum non-finite
    float* to = stride == 1 ? y : tmp;
    const auto inv = static_cast<float>(1.0 / den);
    scale_copy(rows[0], f[0] * inv, to, dv);
    for (int u = 1; u < used; ++u) scale_add(rows[u], f[u] * inv, to, to, dv);
    ok = std::isfinite(sum_values(to, dv));
    if (ok && stride != 1)
      for (int64_t x = 0; x < dv; ++x) y[x * stride] = to[x];
  }
  if (!ok) {
    for (int64_t x = 0; x < dv; ++x) y[x * stride] = 0.0f;
    *lse = -INFINITY;
    return false;
  }
  *lse = S + std::log(den);
  return true;
}

// Merges row i's exact [num | den] (log scale top) with the estimated parts' rows into y_i
// (merge_parts) and lse_i where set.
bool merge_row(const BandParams& bp, int64_t bh, int64_t i, const float* exact, double top,
               float* y, int64_t stride, double* lse, float* tmp) {
  const int64_t n = bp.p.nq, dv = bp.p.dv, ld = dv + 1;
  const float* rows[3] = {exact, nullptr, nullptr};
  double scales[3] = {top, -INFINITY, -INFINITY};
  int used = 1;
  for (int q = 0; q < bp.part_count; ++q) {
    const kernels::BandPart& part = bp.parts[q];
    const int64_t r = part.reversed ? n - 1 - part.offset - i : i - part.offset;
    if (r < part.first || r >= part.first + part.rows) continue;
    const int64_t at = bh * part.head_stride + r - part.first;
    const double L = part.shift[at];
    if (std::isinf(L)) continue;
    rows[used] = part.data + at * ld;
    scales[used++] = L;
  }
  double l = 0.0;
  const bool ok = merge_parts(rows, scales, used, dv, y, stride, tmp, &l);
  if (lse) lse[bh * n + i] = l;
  return ok;
}

}  // namespace

namespace {

// A tile's scores with the keys along the rows (S^T = K Q^T: each key row of K broadcast
// against Q^T's rows in small_gemm): ws.s [count][rows] for the
// window, ws.ss [ns][rows] for the sinks (gathered into ws.ks, vs), -inf where the key is
// not the row's; ws.qt holds Q^T, cols each row's window columns.
void transposed_scores(const BandParams& bp, int64_t b, int64_t h, int64_t t0, int64_t rows,
                       const TileKeys& t, const TileRows& tr, Columns* cols, BandWorkspace& ws) {
  const kernels::AttentionParams& p = bp.p;
  const int64_t d = p.d, ns = t.ns;
  const auto scale = static_cast<float>(bp.scale);
  float* qt = ws.qt.data();  // Q^T [d][rows]
  small_transpose(tr.q.data, tr.q.ld, rows, d, qt, rows);
  float* st = ws.s.data();
  float* sst = ws.ss.data();
  for (int64_t r = 0; r < rows; ++r) cols[r] = window_columns(bp, t, t0 + r);
  if (t.count > 0) keys_by_rows(cols, rows, d, scale, tr.k.data, tr.k.ld, qt, st);
  if (ns > 0) {
    gather_sinks(p, b, h, t, ws);
    small_gemm(false, ns, rows, d, scale, ws.ks.data(), d, qt, rows, 0.0f, sst, rows);
    for (int64_t u = 0; u < ns; ++u)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = t0 + r, j = t.sinks[u];
        if (in_window(bp, i, j) || (bp.causal && j > i)) sst[u * rows + r] = -INFINITY;
      }
  }
  // each key's rows, [first, last): window_columns is monotone in the row, so both bounds
  // only grow with the column; -inf outside them
  int64_t first = 0, last = 0;
  for (int64_t c = 0; c < t.count; ++c) {
    while (first < rows && cols[first].hi <= c) ++first;
    last = std::max(last, first);
    while (last < rows && cols[last].lo <= c) ++last;
    float* x = st + c * rows;
    if (!visible(p, b, t.lo + c)) {
      std::fill(x, x + rows, -INFINITY);
      continue;
    }
    std::fill(x, x + first, -INFINITY);
    std::fill(x + last, x + rows, -INFINITY);
  }
}

// A tile's exact rows from transposed_scores: ws.o [rows][dv + 1] = [sum exp(s_ij - M_i) v_j |
// sum exp(s_ij - M_i)], tops[r] = M_i; the row max, exp(s - M) (-inf: 0) and the row sums
// over whole columns (full SIMD vectors), then P V as P^T's transpose.
void exact_rows(const BandParams& bp, int64_t b, int64_t h, int64_t t0, int64_t rows,
                const TileKeys& t, const TileRows& tr, float* tops, BandWorkspace& ws) {
  const int64_t dv = bp.p.dv, ld = dv + 1, ns = t.ns;
  Columns cols[kBandTile];
  transposed_scores(bp, b, h, t0, rows, t, tr, cols, ws);
  float* st = ws.s.data();
  float* sst = ws.ss.data();
  for (int64_t r = 0; r < rows; ++r) tops[r] = -INFINITY;
  columns_max(st, t.count, rows, tops);
  columns_max(sst, ns, rows, tops);
  float neg[kBandTile], den[kBandTile];
  for (int64_t r = 0; r < rows; ++r) {
    neg[r] = std::isinf(tops[r]) ? 0.0f : -tops[r];  // a row with no key reads nothing
    den[r] = 0.0f;
  }
  columns_exp(st, t.count, rows, neg, den);
  columns_exp(sst, ns, rows, neg, den);
  float* out = ws.o.data();
  if (t.count > 0)
    rows_by_keys(cols, rows, dv, st, tr.v.data, tr.v.ld, 0.0f, out, ld);
  else
    for (int64_t r = 0; r < rows; ++r) std::fill(out + r * ld, out + r * ld + dv, 0.0f);
  if (ns > 0) small_gemm(true, rows, dv, ns, 1.0f, sst, rows, ws.vs.data(), dv, 1.0f, out, ld);
  for (int64_t r = 0; r < rows; ++r) out[r * ld + dv] = den[r];
}

}  // namespace

int64_t band_rows(const BandParams& bp, int64_t bh, int64_t begin, int64_t end, BandWorkspace& ws) {
  const kernels::AttentionParams& p = bp.p;
  const int64_t ld = p.dv + 1;
  const int64_t b = bh / p.heads, h = bh % p.heads;
  float* yh = p.out + b * p.out_strides[0] + h * p.out_strides[1];
  int64_t zero_rows = 0;
  for (int64_t t0 = begin; t0 < end; t0 += kBandTile) {
    const int64_t rows = std::min(kBandTile, end - t0);
    const TileKeys t = tile_keys(bp, b, t0, rows);
    const TileRows tr = tile_rows(p, b, h, t0, rows, t, ws);
    float tops[kBandTile];
    exact_rows(bp, b, h, t0, rows, t, tr, tops, ws);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = t0 + r;
      if (!merge_row(bp, bh, i, ws.o.data() + r * ld, tops[r], yh + i * p.out_strides[2],
                     p.out_strides[3], bp.lse, ws.y.data()))
        ++zero_rows;
    }
  }
  return zero_rows;
}

LentWorkspaces<BandWorkspace> lend_band_workspaces(const BandParams& bp, int team) {
  return lend_workspaces<BandWorkspace>(team, bp.p.d, bp.p.dv, span_of(bp), bp.sinks);
}

int64_t band_forward(const BandParams& bp, const Config& config) {
  const kernels::AttentionParams& p = bp.p;
  const double flops =
      double(p.batch * p.heads * p.nq) * double(span_of(bp) + bp.sinks) * (2.0 * (p.d + p.dv));
  const Schedule plan = heads_only(p.batch * p.heads, config.threads, flops);
  auto lease = lend_band_workspaces(bp, plan.team);
  return for_each_head(plan, lease.spaces(), [&](int64_t bh, BandWorkspace& ws) {
    return band_rows(bp, bh, 0, p.nq, ws);
  });
}

void band_decode_row(const kernels::BandDecodeParams& p, int64_t bh, int64_t t,
                     const float* part_row, double part_shift, float* scratch) {
  const int64_t keys = p.window + p.sinks, d = p.d, dv = p.dv, ld = dv + 1;
  const int64_t b = bh / p.heads, h = bh % p.heads;
  float* q = scratch;
  float* s = q + d;
  float* exact = s + std::max<int64_t>(keys, 1);
  float* tmp = exact + ld;
  const float* qi = p.q + b * p.q_strides[0] + h * p.q_strides[1] + t * p.q_strides[2];
  for (int64_t x = 0; x < d; ++x) q[x] = qi[x * p.q_strides[3]];
  // the exact part: scores of the live keys (-inf elsewhere), their max, exp, and the
  // sums V^T p over the ring, then the sinks (a dead key's weight is 0)
  const float* ring_k = p.ring_k + bh * p.window * d;
  const float* sink_k = p.sink_k + bh * p.sinks * d;
  const auto scale = static_cast<float>(p.scale);
  row_dots(ring_k, p.window, d, q, scale, s);
  row_dots(sink_k, p.sinks, d, q, scale, s + p.window);
  float top = -INFINITY;
  for (int64_t u = 0; u < keys; ++u) {
    const bool live = u < p.window ? p.ring_live[b * p.window + u] != 0
                                   : p.sink_live[b * p.sinks + u - p.window] != 0;
    if (!live) s[u] = -INFINITY;
    top = std::max(top, s[u]);
  }
  std::fill(exact, exact + ld, 0.0f);
  if (!std::isinf(top)) {
    exp_affine(s, 1.0f, -top, s, keys);  // -inf: 0
    transposed_matvec(p.ring_v + bh * p.window * dv, s, p.window, dv, exact);
    if (p.sinks > 0) {
      transposed_matvec(p.sink_v + bh * p.sinks * dv, s + p.window, p.sinks, dv, tmp);
      for (int64_t x = 0; x < dv; ++x) exact[x] += tmp[x];
    }
    exact[dv] = sum_values(s, keys);
  }
  const float* rows[2] = {exact, part_row};
  const double scales[2] = {top, part_shift};
  double lse = 0.0;
  float* y = p.out + b * p.out_strides[0] + h * p.out_strides[1] + t * p.out_strides[2];
  merge_parts(rows, scales, 2, dv, y, p.out_strides[3], tmp, &lse);
}

void band_decode(const kernels::BandDecodeParams& p) {
  const int64_t ld = p.dv + 1;
  std::vector<float> scratch(static_cast<size_t>(band_decode_floats(p)));
  for (int64_t bh = 0; bh < p.batch * p.heads; ++bh)
    for (int64_t t = 0; t < p.T; ++t)
      band_decode_row(p, bh, t, p.part_rows + (bh * p.T + t) * ld, p.part_shift[bh * p.T + t],
                      scratch.data());
}

void band_backward(const BandBackwardParams& g, const Config& config) {
  const BandParams& bp = g.band;
  const kernels::AttentionParams& p = bp.p;
  const int64_t d = p.d, dv = p.dv, span = span_of(bp);
  const double flops =
      double(p.batch * p.heads * p.nq) * double(span + bp.sinks) * (4.0 * (d + dv));
  const Schedule plan = heads_only(p.batch * p.heads, config.threads, flops);
  auto lease = lend_band_workspaces(bp, plan.team);
  for_each_head(plan, lease.spaces(), [&](int64_t bh, BandWorkspace& ws) {
    const int64_t b = bh / p.heads, h = bh % p.heads;
    const auto scale = static_cast<float>(bp.scale);
    float* dq = g.dq + bh * p.nq * d;
    float* dk = g.dk + bh * p.nk * d;
    float* dvh = g.dv + bh * p.nk * dv;
    for (int64_t t0 = 0; t0 < p.nq; t0 += kBandTile) {
      const int64_t rows = std::min(kBandTile, p.nq - t0);
      const TileKeys t = tile_keys(bp, b, t0, rows);
      const int64_t ns = t.ns;
      if (t.count == 0 && ns == 0) continue;
      const TileRows tr = tile_rows(p, b, h, t0, rows, t, ws);
      Columns cols[kBandTile];
      transposed_scores(bp, b, h, t0, rows, t, tr, cols, ws);
      // the tile's dy (rows x dv: in place or gathered), dy^T, y . dy and -lse per row (-inf:
      // a zero row, whose weights are then 0)
      const Rows dyr = rows_of(g.dy, g.dy_strides, b, h, t0, rows, dv, ws.dy.data());
      float* dyt = ws.dyt.data();
      float delta[kBandTile], neg[kBandTile];
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = t0 + r;
        delta[r] = dot(dyr.row(r), g.merged_y + (bh * p.nq + i) * dv, dv);
        const double lse = g.merged_lse[bh * p.nq + i];
        neg[r] = std::isinf(lse) ? -INFINITY : static_cast<float>(-lse);
      }
      small_transpose(dyr.data, dyr.ld, rows, dv, dyt, rows);
      // P^T = exp(S^T - lse) (-inf: 0); dP^T = V dY^T; dS^T = scale P^T (dP^T - y . dy)
      float* st = ws.s.data();
      float* sst = ws.ss.data();
      float* dpt = ws.dp.data();
      float* dpst = ws.dps.data();
      columns_exp(st, t.count, rows, neg, nullptr);
      columns_exp(sst, ns, rows, neg, nullptr);
      if (t.count > 0) keys_by_rows(cols, rows, dv, 1.0f, tr.v.data, tr.v.ld, dyt, dpt);
      if (ns > 0)
        small_gemm(false, ns, rows, dv, 1.0f, ws.vs.data(), dv, dyt, rows, 0.0f, dpst, rows);
      // (a weight of 0 gives 0: also outside the rows' windows, where keys_by_rows wrote nothing)
      columns_score_grad(dpt, st, t.count, rows, delta, scale);
      columns_score_grad(dpst, sst, ns, rows, delta, scale);
      if (t.count > 0) {
        // dq_t += dS K_win; dk_win += dS^T q_t; dv_win += P^T dy_t
        rows_by_keys(cols, rows, d, dpt, tr.k.data, tr.k.ld, 1.0f, dq + t0 * d, d);
        keys_by_tile_rows(cols, t.count, rows, d, dpt, tr.q.data, tr.q.ld, dk + t.lo * d, d);
        keys_by_tile_rows(cols, t.count, rows, dv, st, dyr.data, dyr.ld, dvh + t.lo * dv, dv);
      }
      if (ns > 0) {
        small_gemm(true, rows, d, ns, 1.0f, dpst, rows, ws.ks.data(), d, 1.0f, dq + t0 * d, d);
        small_gemm(false, ns, d, rows, 1.0f, dpst, rows, tr.q.data, tr.q.ld, 0.0f, ws.dks.data(),
                   d);
        small_gemm(false, ns, dv, rows, 1.0f, sst, rows, dyr.data, dyr.ld, 0.0f, ws.dvs.data(), dv);
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
