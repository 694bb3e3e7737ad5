#pragma once
// The exact part of hybrid attention (kernels/band_params.hpp): softmax terms over each
// query's window and sinks, O(N (w + s) D) per head, one task per head.
#include "cpu/config.hpp"
#include "kernels/band_params.hpp"

namespace favor::cpu {

/// Each row's [num | den] and its max M_i into p.p.part_rows / part_shift.
void band_forward(const kernels::BandParams& p, const Config& config);
/// Adds the exact terms' gradients (given the merged output) to dq, dk, dv.
void band_backward(const kernels::BandBackwardParams& p, const Config& config);

}  // namespace favor::cpu
