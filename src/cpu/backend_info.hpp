#pragma once
// The CPU backend's tile sizes and build description (kernels::Backend::tuning, describe).
#include <string>

#include "kernels/backend.hpp"

namespace favor::cpu {

kernels::Tuning tuning();
std::string describe();
/// The CPU's brand string (CPUID), e.g. "AMD EPYC 7B12".
std::string cpu_model();

}  // namespace favor::cpu
