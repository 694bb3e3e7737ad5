#include "cpu/key_state.hpp"

#include <algorithm>
#include <cmath>

#include "cpu/feature_tile.hpp"
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
