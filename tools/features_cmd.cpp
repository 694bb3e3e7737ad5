// favor features: the exact feature map phi(x) of a .npy input.
#include <memory>

#include "cli_common.hpp"
#include "commands.hpp"

namespace favor::cli {
namespace {

struct FeaturesArgs {
  std::string x, out, kernel = "positive";
  std::optional<double> scale;
  ProjectionArgs projection;
};

void run(const FeaturesArgs& a) {
  const Kernel kernel = parse_kernel(a.kernel, "--kernel");
  const InputTensor x = read_tensor(a.x, "--x");
  const Projection w = make_projection(a.projection, x.tensor.shape()[3]);
  const Tensor phi = features(x.tensor, w, {kernel, a.scale});
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
                  "output .npy, float32 [N, F] or [B, H, N, F]; F = m (positive) or 2m")
      ->required();
  cmd->add_option("--kernel", args->kernel, "positive | trig | hyperbolic")->capture_default_str();
  cmd->add_option("--scale", args->scale,
                  "temperature: the kernel is exp(scale x.y); default 1/sqrt(D)");
  add_projection_options(cmd, args->projection);
  cmd->callback([args] { run(*args); });
}

}  // namespace favor::cli
