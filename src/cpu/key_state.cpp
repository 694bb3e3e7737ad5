#include "cpu/key_state.hpp"

#include <algorithm>
#include <cmath>

#include "cpu/feature_tile.hpp"
#include "cpu/schedule.hpp"
#include "cpu/tiles.hpp"

namespace favor::cpu {

KeyTile::KeyTile(int64_t d, int64_t m, int64_t features, int64_t dv)
    : x(kRowTile * d),
      a(kRowTile * m),
      phi(kRowTile * features),
      vx(kRowTile * (dv + 1)),
      half_norm2(kRowTile),
      g(kRowTile),
      index(kRowTile) {}

int64_t gather_key_tile(const AttentionParams& p, int64_t b, int64_t h, int64_t* next, int64_t end,
                        KeyTile& t) {
  const float* kh = p.k + b * p.k_strides[0] + h * p.k_strides[1];
  const float* vh = p.v + b * p.v_strides[0] + h * p.v_strides[1];
  int64_t rows = 0;
  for (; rows < kRowTile && *next < end; ++*next) {
    const int64_t j = *next;
    if (p.mask && p.mask[b * p.mask_stride_b + j * p.mask_stride_n] == 0) continue;
    gather_rows(kh + j * p.k_strides[2], p.k_strides[2], p.k_strides[3], 1, p.d, p.map.sqrt_scale,
                t.x.data() + rows * p.d, t.half_norm2.data() + rows);
    gather_values(vh + j * p.v_strides[2], p.v_strides[2], p.v_strides[3], 1, p.dv,
                  t.vx.data() + rows * (p.dv + 1));
    t.index[rows] = j;
    ++rows;
  }
  return rows;
}

double project_key_tile(const AttentionParams& p, int64_t bh, int64_t rows, KeyTile& t) {
  const int64_t m = p.map.m;
  project_rows(t.x.data(), rows, p.d, p.map.head_w(bh), m, t.a.data(), p.map.head_bias(bh));
  double tile_max = -INFINITY;
  for (int64_t r = 0; r < rows; ++r) {
    t.g[r] = p.map.key_log_weight(t.half_norm2[r], bh, p.first_position + t.index[r]);
    tile_max = std::max(tile_max, key_log_max(p.map, bh, t.a.data() + r * m, t.g[r]));
  }
  return tile_max;
}

void accumulate_keys(const AttentionParams& p, int64_t b, int64_t h, int64_t begin, int64_t end,
                     KeyTile& t, HeadState& state) {
  const int64_t m = p.map.m, F = state.features, bh = b * p.heads + h;
  for (int64_t next = begin; next < end;) {
    const int64_t rows = gather_key_tile(p, b, h, &next, end, t);
    if (rows == 0) break;
    const double tile_max = project_key_tile(p, bh, rows, t);
    if (tile_max > state.max) state.raise_max(tile_max);
    for (int64_t r = 0; r < rows; ++r) {
      key_features(p.map, bh, t.a.data() + r * m, t.g[r] - state.max, t.phi.data() + r * F);
    }
    state.accumulate(t.phi.data(), t.vx.data(), rows);
  }
}

}  // namespace favor::cpu

namespace favor::cpu {
namespace {

// accumulate_keys over all keys of head (b, h) that also keeps the distance state
// D = sum_j (nk - j) phi(k_j) [v_j | 1] at the state's max.
void accumulate_keys_with_distance(const AttentionParams& p, int64_t b, int64_t h, KeyTile& t,
                                   HeadState& state, float* distance, std::vector<float>& wv) {
  const int64_t m = p.map.m, F = state.features, ld = state.ld(), bh = b * p.heads + h;
  for (int64_t next = 0; next < p.nk;) {
    const int64_t rows = gather_key_tile(p, b, h, &next, p.nk, t);
    if (rows == 0) break;
    const double tile_max = project_key_tile(p, bh, rows, t);
    if (tile_max > state.max) {
      if (!std::isinf(state.max)) {
        const auto f = static_cast<float>(std::exp(state.max - tile_max));
        for (int64_t i = 0; i < F * ld; ++i) distance[i] *= f;
      }
      state.raise_max(tile_max);
    }
    for (int64_t r = 0; r < rows; ++r) {
      key_features(p.map, bh, t.a.data() + r * m, t.g[r] - state.max, t.phi.data() + r * F);
      const auto weight = static_cast<float>(p.nk - t.index[r]);
      for (int64_t x = 0; x < ld; ++x) wv[r * ld + x] = weight * t.vx[r * ld + x];
    }
    state.accumulate(t.phi.data(), t.vx.data(), rows);
    HeadState dist{distance, F, p.dv, state.max};
    dist.accumulate(t.phi.data(), wv.data(), rows);
  }
}

struct KeyStateSpace {
  KeyTile tile;
  std::vector<float> wv;
  KeyStateSpace(int64_t d, int64_t m, int64_t F, int64_t dv, bool distance)
      : tile(d, m, F, dv), wv(distance ? kRowTile * (dv + 1) : 0) {}
};

}  // namespace

void key_states(const AttentionParams& p, const Config& config, float* states, double* maxima,
                float* distance) {
  const int64_t F = p.map.features(), ld = p.dv + 1;
  const Schedule plan = heads_only(p.batch * p.heads, config.threads);
  auto lease =
      lend_workspaces<KeyStateSpace>(plan.team, p.d, p.map.m, F, p.dv, distance != nullptr);
  std::vector<KeyStateSpace>& spaces = lease.spaces();
  for_each_head(plan, spaces, [&](int64_t bh, KeyStateSpace& ws) {
    HeadState state{states + bh * F * ld, F, p.dv};
    state.clear();
    const int64_t b = bh / p.heads, h = bh % p.heads;
    if (distance) {
      float* dist = distance + bh * F * ld;
      std::fill(dist, dist + F * ld, 0.0f);
      accumulate_keys_with_distance(p, b, h, ws.tile, state, dist, ws.wv);
    } else {
      accumulate_keys(p, b, h, 0, p.nk, ws.tile, state);
    }
    maxima[bh] = state.max;
    return int64_t{0};
  });
}

}  // namespace favor::cpu
