// favor features: the exact feature map phi(x) of a .npy input.
#include <memory>

#include "cli_common.hpp"
#include "commands.hpp"
#include "fit_args.hpp"

namespace favor::cli {
namespace {

struct FeaturesArgs {
  std::string x, out, kernel = "positive";
  std::optional<double> scale;
  ProjectionArgs projection;
  FitArgs fit;
};

void run(const FeaturesArgs& a) {
  const Kernel kernel = parse_kernel(a.kernel, "--kernel");
  const InputTensor x = read_tensor(a.x, "--x");
  const Projection w = make_projection(a.projection, x.shape()[3]);
  const std::optional<KernelFit> fit = make_fit(a.fit, kernel, a.scale, x.shape()[3]);
  if (data_adapted(kernel) && !fit) {
    throw Error("--fit-a / --fit-q,--fit-k: the " + to_string(kernel) +
                " features need a fit (the same one for queries and keys)");
  }
  const Tensor phi = features(x.tensor, w, {kernel, a.scale, fit});
  StagedOutputs outputs;
  if (!a.projection.save.empty()) {
    outputs.stage(a.projection.save, encode_npy_f32({w.m(), w.d()}, w.data()), "--save-projection");
  }
  outputs.stage(a.out, encode_tensor(phi, x.rank), "--out");
  outputs.commit();
}

}  // namespace

void add_features_command(CLI::App& app) {
  auto args = std::make_shared<FeaturesArgs>();
  CLI::App* cmd = app.add_subcommand("features",
                                     "The exact feature map phi(x) (constants kept, no "
                                     "stabilisation): phi(q).phi(k) estimates exp(scale q.k)");
  cmd->add_option("--x", args->x, "input .npy, [N, D] or [B, H, N, D], float32/float64")
      ->required();
  cmd->add_option("--out", args->out,
                  "output .npy, float32 [N, F] or [B, H, N, F]; F = 2m (trig, hyperbolic) or m")
      ->required();
  cmd->add_option("--kernel", args->kernel, "positive | trig | hyperbolic | favorpp | favorsharp")
      ->capture_default_str();
  cmd->add_option("--scale", args->scale,
                  "temperature: the kernel is exp(scale x.y); default 1/sqrt(D)");
  add_projection_options(cmd, args->projection);
  add_fit_options(cmd, args->fit);
  cmd->callback([args] { run(*args); });
}

}  // namespace favor::cli
