// The exact part of hybrid attention, per (batch, head): for query i the keys E(i) = its
// window plus the batch row's sinks (visible keys only; causal: j <= i), scores
// s_ij = scale q_i . k_j. Forward: [sum exp(s_ij - M_i) v_j | sum exp(s_ij - M_i)] and M_i.
// Backward, from the merged row (y_i, lse_i): P_ij = exp(s_ij - lse_i), dv_j += P_ij dy_i,
// ds_ij = P_ij (dy_i . v_j - dy_i . y_i), dq_i += scale ds_ij k_j, dk_j += scale ds_ij q_i.
// The head's rows are gathered once (memory O(N (D + Dv)) per thread).
#include "cpu/band_attention.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/schedule.hpp"
#include "cpu/vec_math.hpp"

namespace favor::cpu {
namespace {

using kernels::BandBackwardParams;
using kernels::BandParams;

struct Workspace {
  std::vector<float> q, k, v, s, dy;
  std::vector<int64_t> keys;
  Workspace(int64_t n, int64_t d, int64_t dv, int64_t band)
      : q(n * d), k(n * d), v(n * dv), s(band), dy(dv), keys(band) {}
};

void gather(const float* base, const Shape4& st, int64_t b, int64_t h, int64_t n, int64_t d,
            float* dst) {
  const float* head = base + b * st[0] + h * st[1];
  for (int64_t r = 0; r < n; ++r)
    for (int64_t x = 0; x < d; ++x) dst[r * d + x] = head[r * st[2] + x * st[3]];
}

bool visible(const kernels::AttentionParams& p, int64_t b, int64_t j) {
  return p.mask == nullptr || p.mask[b * p.mask_stride_b + j * p.mask_stride_n] != 0;
}

// The exact keys of query i of batch row b into keys; returns their count.
int64_t exact_keys(const BandParams& bp, int64_t b, int64_t i, int64_t* keys) {
  const kernels::AttentionParams& p = bp.p;
  const int64_t lo = std::max<int64_t>(0, i - bp.window + 1);
  const int64_t hi = bp.causal ? i : std::min(p.nk - 1, i + bp.window - 1);
  int64_t count = 0;
  for (int64_t t = 0; t < bp.sinks; ++t) {
    const int64_t j = bp.sink_index[b * bp.sinks + t];
    if (j < 0) break;
    if ((j < lo || j > hi) && !(bp.causal && j > i)) keys[count++] = j;
  }
  for (int64_t j = lo; j <= hi; ++j)
    if (visible(p, b, j)) keys[count++] = j;
  return count;
}

int64_t band_size(const BandParams& bp) {
  return std::min(bp.p.nk, 2 * bp.window + bp.sinks + 1);
}

void load_head(const kernels::AttentionParams& p, int64_t b, int64_t h, Workspace& ws) {
  gather(p.q, p.q_strides, b, h, p.nq, p.d, ws.q.data());
  gather(p.k, p.k_strides, b, h, p.nk, p.d, ws.k.data());
  gather(p.v, p.v_strides, b, h, p.nk, p.dv, ws.v.data());
}

}  // namespace

void band_forward(const BandParams& bp, const Config& config) {
  const kernels::AttentionParams& p = bp.p;
  const int64_t d = p.d, dv = p.dv, ld = dv + 1;
  const double flops = double(p.batch * p.heads * p.nq) * double(band_size(bp)) * (2.0 * (d + dv));
  const Schedule plan = heads_only(p.batch * p.heads, config.threads, flops);
  auto spaces = make_workspaces<Workspace>(plan.team, p.nk, d, dv, band_size(bp));
  for_each_head(plan, spaces, [&](int64_t bh, Workspace& ws) {
    const int64_t b = bh / p.heads, h = bh % p.heads;
    load_head(p, b, h, ws);
    const auto scale = static_cast<float>(bp.scale);
    for (int64_t i = 0; i < p.nq; ++i) {
      float* row = p.part_rows + (bh * p.nq + i) * ld;
      std::fill(row, row + ld, 0.0f);
      const int64_t count = exact_keys(bp, b, i, ws.keys.data());
      if (count == 0) {
        p.part_shift[bh * p.nq + i] = -INFINITY;
        continue;
      }
      const float* qi = ws.q.data() + i * d;
      for (int64_t t = 0; t < count; ++t)
        ws.s[t] = scale * dot(qi, ws.k.data() + ws.keys[t] * d, d);
      const float mx = max_value(ws.s.data(), count);
      exp_affine(ws.s.data(), 1.0f, -mx, ws.s.data(), count);
      for (int64_t t = 0; t < count; ++t) {
        const float e = ws.s[t];
        const float* vj = ws.v.data() + ws.keys[t] * dv;
        for (int64_t x = 0; x < dv; ++x) row[x] += e * vj[x];
        row[dv] += e;
      }
      p.part_shift[bh * p.nq + i] = mx;
    }
    return int64_t{0};
  });
}

void band_backward(const BandBackwardParams& g, const Config& config) {
  const BandParams& bp = g.band;
  const kernels::AttentionParams& p = bp.p;
  const int64_t d = p.d, dv = p.dv;
  const double flops = double(p.batch * p.heads * p.nq) * double(band_size(bp)) * (4.0 * (d + dv));
  const Schedule plan = heads_only(p.batch * p.heads, config.threads, flops);
  auto spaces = make_workspaces<Workspace>(plan.team, p.nk, d, dv, band_size(bp));
  for_each_head(plan, spaces, [&](int64_t bh, Workspace& ws) {
    const int64_t b = bh / p.heads, h = bh % p.heads;
    load_head(p, b, h, ws);
    const auto scale = static_cast<float>(bp.scale);
    float* dq = g.dq + bh * p.nq * d;
    float* dk = g.dk + bh * p.nk * d;
    float* dvh = g.dv + bh * p.nk * dv;
    const float* dyh = g.dy + b * g.dy_strides[0] + h * g.dy_strides[1];
    for (int64_t i = 0; i < p.nq; ++i) {
      const double lse = g.merged_lse[bh * p.nq + i];
      if (std::isinf(lse)) continue;  // a zero row passes no gradient
      const int64_t count = exact_keys(bp, b, i, ws.keys.data());
      if (count == 0) continue;
      for (int64_t x = 0; x < dv; ++x) ws.dy[x] = dyh[i * g.dy_strides[2] + x * g.dy_strides[3]];
      const float* qi = ws.q.data() + i * d;
      const float* yi = g.merged_y + (bh * p.nq + i) * dv;
      const float delta = dot(ws.dy.data(), yi, dv);
      float* dqi = dq + i * d;
      for (int64_t t = 0; t < count; ++t) {
        const int64_t j = ws.keys[t];
        const float* kj = ws.k.data() + j * d;
        const float* vj = ws.v.data() + j * dv;
        const auto P = static_cast<float>(std::exp(double(scale * dot(qi, kj, d)) - lse));
        const float ds = scale * P * (dot(ws.dy.data(), vj, dv) - delta);
        float* dkj = dk + j * d;
        float* dvj = dvh + j * dv;
        for (int64_t x = 0; x < d; ++x) {
          dqi[x] += ds * kj[x];
          dkj[x] += ds * qi[x];
        }
        for (int64_t x = 0; x < dv; ++x) dvj[x] += P * ws.dy[x];
      }
    }
    return int64_t{0};
  });
}

}  // namespace favor::cpu
