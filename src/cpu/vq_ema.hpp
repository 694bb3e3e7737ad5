#pragma once
// The EMA step of codebook training (math.md s.6): per-code sums and counts decay by g and
// gain (1 - g) times this update's assigned keys; codes unused for dead_after updates restart
// from random keys of the update. The facade (src/codebook.cpp) validates; nothing throws.
#include <cstdint>

#include "cpu/config.hpp"
#include "cpu/vq_key_groups.hpp"
#include "kernels/codebook_params.hpp"

namespace favor::cpu {

using EMAParams = kernels::CodebookEMA;

/// One EMA step on the groups' keys (group g updates codebook g); returns the number of
/// codes re-seeded.
int64_t codebook_ema(const KeyGroups& keys, const EMAParams& p, const Config& config);

}  // namespace favor::cpu
