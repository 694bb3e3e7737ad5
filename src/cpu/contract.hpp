#pragma once
// The CPU backend, the only one (the C++ library is CPU-only: kernels/backend.hpp), implements
// the kernel contract (src/kernels/): its names, used unqualified inside favor::cpu.
#include "kernels/feature_params.hpp"

namespace favor::cpu {

using kernels::FeatureParams;
using kernels::KeyNorm;

}  // namespace favor::cpu
