#pragma once
// The CPU backend implements the device-neutral kernel contract (src/kernels/): its names,
// used unqualified inside favor::cpu.
#include "kernels/feature_params.hpp"

namespace favor::cpu {

using kernels::FeatureParams;
using kernels::KeyNorm;

}  // namespace favor::cpu
