#pragma once
// The keys each codebook learns from, gathered into one contiguous block per codebook, and
// their nearest codes. Codebook learning (src/codebook.cpp) uses one group per head, or one
// group pooling every head when a codebook is shared. Tiles of rows have a fixed size, and
// every reduction over a group runs in row order, so results do not depend on the threads.
#include <cstdint>
#include <optional>
#include <vector>

#include "favor/tensor.hpp"

namespace favor::cpu {

/// Rows per assignment tile: 256 rows x c = 256 codes x 4 B = 256 KiB of scores, as the
/// feature tiles of tiles.hpp.
constexpr int64_t kAssignTile = 256;

struct KeyGroups {
  int64_t groups = 0, d = 0;
  std::vector<int64_t> start;  // rows of group g: [start[g], start[g + 1])
  std::vector<float> rows;     // every unmasked key, d floats each, group by group
  int64_t size(int64_t g) const { return start[g + 1] - start[g]; }
  const float* row(int64_t r) const { return rows.data() + r * d; }
};

/// fn(group, b, h, n) for every unmasked key of keys [B, H, N, D], in the order of
/// gather_keys: by group (head, or one group when pooled), then batch, head and position.
template <class Fn>
void for_each_key(const TensorView& keys, const std::optional<KeyMaskView>& mask, bool pooled,
                  Fn fn) {
  const Shape4& s = keys.shape;
  const int64_t groups = pooled ? 1 : s[1];
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t b = 0; b < s[0]; ++b)
      for (int64_t h = pooled ? 0 : g; h < (pooled ? s[1] : g + 1); ++h)
        for (int64_t n = 0; n < s[2]; ++n)
          if (!mask || mask->at(b, n)) fn(g, b, h, n);
}

/// The unmasked keys, one group per head or (pooled) a single group.
KeyGroups gather_keys(const TensorView& keys, const std::optional<KeyMaskView>& mask, bool pooled);

/// Nearest code z[r] and |x_r - C_z|^2 (dist2[r]) of every row r of every group, group g
/// against codebook + g * codebook_stride (codes x d). Tiles of rows over `threads`. Groups
/// with active[g] == 0 are skipped (active null: every group).
void assign_groups(const KeyGroups& keys, const float* codebook, int64_t codebook_stride,
                   int64_t codes, int threads, int32_t* z, float* dist2,
                   const uint8_t* active = nullptr);

}  // namespace favor::cpu
