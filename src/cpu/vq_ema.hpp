#pragma once
// The EMA step of codebook training (math.md s.6): per-code sums and counts decay by g and
// gain (1 - g) times this update's assigned keys; codes unused for dead_after updates restart
// from random keys of the update. The facade (src/codebook.cpp) validates; nothing throws.
#include <cstdint>

#include "cpu/vq_key_groups.hpp"

namespace favor::cpu {

struct EMAParams {
  float* codebook;   // [groups][codes][d]
  float* ema_sum;    // [groups][codes][d]
  float* ema_count;  // [groups][codes]
  int64_t* unused;   // [groups][codes]
  int64_t codes, d;
  double decay, eps;
  int64_t dead_after;  // 0: never re-seed
  uint64_t seed;       // group g draws from Rng(seed, g)
  int threads;
};

/// One EMA step on the groups' keys (group g updates codebook g); returns the number of
/// codes re-seeded.
int64_t codebook_ema(const KeyGroups& keys, const EMAParams& p);

}  // namespace favor::cpu
