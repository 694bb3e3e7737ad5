#pragma once
// The key pass shared by the bidirectional kernel, the causal segment pre-pass and the
// decoder's prefill: [S | s] += phi(K)^T [V | 1] over a range of keys, in tiles, with the
// running-max stabiliser (cpu/feature_tile.hpp). Masked keys are skipped.
#include <cstdint>
#include <vector>

#include "cpu/attention_params.hpp"
#include "cpu/head_state.hpp"

namespace favor::cpu {

/// Buffers of one tile of kRowTile rows (keys, or queries in the bidirectional kernel).
struct KeyTile {
  std::vector<float> x, a, phi, vx;
  std::vector<double> half_norm2, g;
  std::vector<int64_t> index;  // positions of the gathered keys
  KeyTile(int64_t d, int64_t m, int64_t features, int64_t dv);
};

/// Gathers the next tile of unmasked keys of head (b, h), from *next up to end: scaled key
/// rows into tile.x (and half norms), [v | 1] into tile.vx, their positions into tile.index.
/// Advances *next; returns the row count (0 at the end).
int64_t gather_key_tile(const AttentionParams& p, int64_t b, int64_t h, int64_t* next, int64_t end,
                        KeyTile& tile);
/// Projects the gathered keys of head bh and sets tile.g to their log weights
/// (map.key_log_weight, positions from tile.index); returns the largest log-feature.
double project_key_tile(const AttentionParams& p, int64_t bh, int64_t rows, KeyTile& tile);

/// Adds keys [begin, end) of head (b, h) to `state` (which may already hold keys).
void accumulate_keys(const AttentionParams& p, int64_t b, int64_t h, int64_t begin, int64_t end,
                     KeyTile& tile, HeadState& state);

}  // namespace favor::cpu
