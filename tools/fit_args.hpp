#pragma once
// The FAVOR++ / FAVOR# fit options shared by `favor attention` and `favor features`.
#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "favor/favor.hpp"

namespace favor::cli {

struct FitArgs {
  std::optional<double> a;  // --fit-a: FAVOR++ with one A for every head
  std::string q, k;         // --fit-q, --fit-k: calibration queries and keys
};

void add_fit_options(CLI::App* cmd, FitArgs& args);
/// The fit the options ask for, or none. Throws favor::Error naming the option when the
/// options do not fit the kernel or the data (head dim d, B*H heads).
std::optional<KernelFit> make_fit(const FitArgs& args, Kernel kernel, std::optional<double> scale,
                                  int64_t d);

}  // namespace favor::cli
