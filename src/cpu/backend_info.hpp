#pragma once
// The CPU backend's tile sizes and build description (kernels::Backend::tuning, describe).
#include <string>

#include "kernels/backend.hpp"

namespace favor::cpu {

kernels::Tuning tuning();
std::string describe();

}  // namespace favor::cpu
