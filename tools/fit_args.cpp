#include "fit_args.hpp"

#include "cli_common.hpp"

namespace favor::cli {

void add_fit_options(CLI::App* cmd, FitArgs& args) {
  cmd->add_option("--fit-a", args.a,
                  "favorpp: use this A (< 1/8) for every head instead of fitting it");
  cmd->add_option("--fit-q", args.q,
                  "favorpp/favorsharp: fit to these calibration queries (.npy, [N, D] or "
                  "[B, H, N, D]; needs --fit-k)");
  cmd->add_option("--fit-k", args.k, "favorpp/favorsharp: calibration keys (with --fit-q)");
}

std::optional<KernelFit> make_fit(const FitArgs& args, Kernel kernel, std::optional<double> scale,
                                  int64_t d) {
  const bool files = !args.q.empty() || !args.k.empty();
  if (!args.a && !files) return std::nullopt;
  check_fit_kernel(kernel, args.a && !files, args.a ? "--fit-a" : "--fit-q/--fit-k", "--kernel",
                   "--fit-q/--fit-k");
  if (args.a && files) throw Error("--fit-a: give either --fit-a or --fit-q/--fit-k, not both");
  if (args.a) return KernelFit::constant(*args.a, d);
  if (args.q.empty() || args.k.empty()) throw Error("--fit-q/--fit-k: give both files");
  const InputTensor q = read_tensor(args.q, "--fit-q"), k = read_tensor(args.k, "--fit-k");
  if (q.shape()[3] != d || k.shape()[3] != d) {
    throw Error("--fit-q/--fit-k: the calibration rows must have the inputs' D = " +
                std::to_string(d));
  }
  return fit_kernel(kernel, q.tensor, k.tensor, scale);
}

}  // namespace favor::cli
