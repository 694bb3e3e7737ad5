#pragma once
// favor::kernel_moments on the CPU (kernels/moments_params.hpp).
#include "cpu/config.hpp"
#include "cpu/contract.hpp"
#include "kernels/moments_params.hpp"

namespace favor::cpu {

using kernels::AttentionParams;
using kernels::MomentsParams;

void kernel_moments(const MomentsParams& p, const Config& config);

}  // namespace favor::cpu
