#pragma once
// The rules about kernel names and fits that every front end applies (the CLI, the Python
// package through favor._core), so that they give one answer with one message.
#include <string>
#include <utility>
#include <vector>

#include "favor/features.hpp"

namespace favor {

/// Every name parse_kernel accepts with its kernel: the names to_string writes, in Kernel
/// order, then the aliases "favor++" and "favor#".
const std::vector<std::pair<std::string, Kernel>>& kernel_names();

/// The rule for a fit given with `kernel`, shared by the CLI (--fit-a, --fit-q/--fit-k) and
/// Python (fit=): only the data-adapted kernels take a fit, and one A for every direction
/// (`constant`: KernelFit::constant) is FAVOR++ alone. Throws favor::Error naming
/// `fit_argument`; `kernel_argument` names the kernel's argument and `calibration` says how
/// FAVOR# gets its fit, each in the caller's terms.
void check_fit_kernel(Kernel kernel, bool constant, const std::string& fit_argument,
                      const std::string& kernel_argument, const std::string& calibration);

}  // namespace favor
