// Bidirectional FAVOR attention for short sequences, per (batch, head): the same estimator
// and the same features as favor_bidirectional.cpp, associated the other way,
//   [y | den] = (phi(Q) phi(K)^T) [V | 1]   instead of   phi(Q) (phi(K)^T [V | 1]),
// which costs Nq Nk (F + Dv + 1) multiply-adds instead of (Nq + Nk) F (Dv + 1) and builds no
// F x (Dv + 1) state: cheaper while Nq Nk (F + Dv + 1) < (Nq + Nk) F (Dv + 1), for Nq = Nk
// below N = 2 F (Dv + 1) / (F + Dv + 1), about 100 at F = 256, Dv = 64. All keys fit one
// tile, so their stabiliser is that tile's max exactly as in the tiled key pass, s is the
// column sum of phi(K) (the state's normaliser column) and the queries get the same shift:
// the features are the same numbers, only the sums run in another order.
//
// Heads are taken in groups whose keys and queries fit kGroupRows rows: their rows are
// gathered into one matrix and projected with one GEMM when the heads share W (else one per
// head, keys and queries together), so a call packs W once instead of twice per head.
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

constexpr int64_t kGroupRows = 2 * kRowTile;  // a head's kept keys and queries always fit

struct ShortWorkspace {
  std::vector<float> x, a, vx, phik, phiq, kernel, yx, s, log_s;
  std::vector<double> half_norm2;
  std::vector<int64_t> index;  // positions of gathered keys
  ShortWorkspace(int64_t d, int64_t m, int64_t F, int64_t dv)
      : x(kGroupRows * d),
        a(kGroupRows * m),
        vx(kGroupRows * (dv + 1)),
        phik(kRowTile * F),
        phiq(kRowTile * F),
        kernel(kRowTile * kRowTile),
        yx(kRowTile * (dv + 1)),
        s(F),
        log_s(F),
        half_norm2(kGroupRows),
        index(kGroupRows) {}
};

// Rows of one head inside its group's matrices: keys [first, first + keys), then queries.
struct HeadRows {
  int64_t first, keys;
};

// Gathers the kept keys (with [v | 1]) and the queries of head (b, h) from row `first`.
HeadRows gather_head(const AttentionParams& p, int64_t b, int64_t h, int64_t first,
                     ShortWorkspace& ws) {
  const int64_t d = p.d, ld = p.dv + 1;
  const float* kh = p.k + b * p.k_strides[0] + h * p.k_strides[1];
  const float* vh = p.v + b * p.v_strides[0] + h * p.v_strides[1];
  const float* qh = p.q + b * p.q_strides[0] + h * p.q_strides[1];
  int64_t row = first;
  for (int64_t j = 0; j < p.nk; ++j) {
    if (p.mask && p.mask[b * p.mask_stride_b + j * p.mask_stride_n] == 0) continue;
    gather_rows(kh + j * p.k_strides[2], p.k_strides[2], p.k_strides[3], 1, d, p.map.sqrt_scale,
                ws.x.data() + row * d, ws.half_norm2.data() + row);
    gather_values(vh + j * p.v_strides[2], p.v_strides[2], p.v_strides[3], 1, p.dv,
                  ws.vx.data() + row * ld);
    ws.index[row] = j;
    ++row;
  }
  gather_rows(qh, p.q_strides[2], p.q_strides[3], p.nq, d, p.map.sqrt_scale, ws.x.data() + row * d,
              nullptr);
  return {first, row - first};
}

// Features and products of head (b, h) from its projected rows; returns its zero rows.
int64_t attend_head(const AttentionParams& p, int64_t b, int64_t h, const HeadRows& rows,
                    ShortWorkspace& ws) {
  const int64_t m = p.map.m, F = p.map.features(), ld = p.dv + 1, bh = b * p.heads + h;
  float* saved = p.ctx_states ? p.ctx_states + bh * F * ld : nullptr;
  if (rows.keys == 0) {  // no visible key: every row is defined as zeros
    if (saved) {         // the empty state, as the tiled path saves it
      std::fill(saved, saved + F * ld, 0.0f);
      p.ctx_maxima[bh] = -INFINITY;
    }
    write_zero_rows(p.out + b * p.out_strides[0] + h * p.out_strides[1], p.nq, p.dv,
                    p.out_strides[2], p.out_strides[3]);
    return p.nq;
  }
  const float* ak = ws.a.data() + rows.first * m;
  const float* aq = ak + rows.keys * m;
  if (const float* bias = p.map.head_bias(bh)) {  // FAVOR++ / FAVOR# log bias on every row
    float* a = ws.a.data() + rows.first * m;
    for (int64_t r = 0; r < rows.keys + p.nq; ++r)
      for (int64_t f = 0; f < m; ++f) a[r * m + f] += bias[f];
  }
  double max = -INFINITY;  // the key stabiliser: the max of the one tile
  // half_norm2 of a key row becomes its log weight g (map.key_log_weight), as KeyTile::g.
  for (int64_t r = 0; r < rows.keys; ++r) {
    const int64_t row = rows.first + r;
    ws.half_norm2[row] =
        p.map.key_log_weight(ws.half_norm2[row], bh, p.first_position + ws.index[row]);
    max = std::max(max, key_log_max(p.map, bh, ak + r * m, ws.half_norm2[row]));
  }
  for (int64_t r = 0; r < rows.keys; ++r)
    key_features(p.map, bh, ak + r * m, ws.half_norm2[rows.first + r] - max,
                 ws.phik.data() + r * F);
  if (positive_family(p.map.kernel)) {  // s = phi(K)^T 1, the state's normaliser column
    std::fill(ws.s.begin(), ws.s.end(), 0.0f);
    for (int64_t r = 0; r < rows.keys; ++r) {
      const float* phi = ws.phik.data() + r * F;
      for (int64_t f = 0; f < F; ++f) ws.s[f] += phi[f];
    }
    log_or_neg_inf(ws.s.data(), ws.log_s.data(), F);
  }
  if (saved) {  // the key state [S | s] = phi(K)^T [V | 1] for the backward pass only
    gemm(true, false, F, ld, rows.keys, 1.0f, ws.phik.data(), F, ws.vx.data() + rows.first * ld, ld,
         0.0f, saved, ld);
    p.ctx_maxima[bh] = max;
  }
  for (int64_t r = 0; r < p.nq; ++r) {
    const float c = query_shift(p.map.kernel, aq + r * m, m, ws.log_s.data());
    query_features(p.map.kernel, aq + r * m, m, c, ws.log_s.data(), ws.phiq.data() + r * F);
  }
  gemm(false, true, p.nq, rows.keys, F, 1.0f, ws.phiq.data(), F, ws.phik.data(), F, 0.0f,
       ws.kernel.data(), rows.keys);  // phi(Q) phi(K)^T
  gemm(false, false, p.nq, ld, rows.keys, 1.0f, ws.kernel.data(), rows.keys,
       ws.vx.data() + rows.first * ld, ld, 0.0f, ws.yx.data(), ld);
  float* oh = p.out + b * p.out_strides[0] + h * p.out_strides[1];
  return write_rows(ws.yx.data(), p.nq, p.dv, oh, p.out_strides[2], p.out_strides[3]);
}

// Heads [begin, end): gathered, projected (one GEMM with a shared W), attended.
int64_t run_group(const AttentionParams& p, int64_t begin, int64_t end, ShortWorkspace& ws) {
  std::vector<HeadRows> rows;  // at most kGroupRows / nq heads: small
  rows.reserve(static_cast<size_t>(end - begin));
  int64_t total = 0;
  for (int64_t bh = begin; bh < end; ++bh) {
    rows.push_back(gather_head(p, bh / p.heads, bh % p.heads, total, ws));
    total += rows.back().keys + p.nq;
  }
  if (p.map.w_sets == 1) {
    gemm(false, true, total, p.map.m, p.d, 1.0f, ws.x.data(), p.d, p.map.w, p.d, 0.0f, ws.a.data(),
         p.map.m);
  } else {
    for (int64_t bh = begin; bh < end; ++bh) {
      const HeadRows& r = rows[static_cast<size_t>(bh - begin)];
      gemm(false, true, r.keys + p.nq, p.map.m, p.d, 1.0f, ws.x.data() + r.first * p.d, p.d,
           p.map.head_w(bh), p.d, 0.0f, ws.a.data() + r.first * p.map.m, p.map.m);
    }
  }
  int64_t zero_rows = 0;
  for (int64_t bh = begin; bh < end; ++bh)
    zero_rows +=
        attend_head(p, bh / p.heads, bh % p.heads, rows[static_cast<size_t>(bh - begin)], ws);
  return zero_rows;
}

}  // namespace

bool favor_bidirectional_short_pays(const AttentionParams& p) {
  // A saved context does not change the path (the outputs keep their bits whether or not a
  // backward pass follows): the short path then also forms the state, for the backward.
  if (p.init_states || p.nq > kRowTile || p.nk > kRowTile) return false;
  const double F = double(p.map.features()), ld = double(p.dv + 1);
  return double(p.nq) * double(p.nk) * (F + ld) < double(p.nq + p.nk) * F * ld;
}

int64_t favor_bidirectional_short(const AttentionParams& p, const Config& config) {
  const int64_t F = p.map.features(), heads = p.batch * p.heads;
  const double flops = double(heads) * (2.0 * double(p.nq + p.nk) * double(p.d * p.map.m) +
                                        2.0 * double(p.nq * p.nk) * double(F + p.dv + 1));
  // Groups of heads whose rows fit kGroupRows; with more than one thread, at least one
  // group per thread.
  const int threads = flops < kSerialFlops ? 1 : config.threads;
  int64_t per_group = std::max<int64_t>(1, kGroupRows / (p.nk + p.nq));
  if (threads > 1) per_group = std::min(per_group, (heads + threads - 1) / threads);
  const int64_t groups = (heads + per_group - 1) / per_group;
  const Schedule plan = heads_only(groups, threads, flops);
  auto lease = lend_workspaces<ShortWorkspace>(plan.team, p.d, p.map.m, F, p.dv);
  return for_each_head(plan, lease.spaces(), [&](int64_t group, ShortWorkspace& ws) {
    return run_group(p, group * per_group, std::min(heads, (group + 1) * per_group), ws);
  });
}

}  // namespace favor::cpu
