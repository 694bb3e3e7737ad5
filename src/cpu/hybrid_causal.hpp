#pragma once
// Causal hybrid attention in one sweep (kernels/band_params.hpp, HybridCausalParams).
#include <cstdint>

#include "cpu/config.hpp"
#include "kernels/band_params.hpp"

namespace favor::cpu {

/// The merged rows into p.band.p.out (and p.band.lse where set); returns the zero rows.
int64_t hybrid_causal(const kernels::HybridCausalParams& p, const Config& config);

}  // namespace favor::cpu
