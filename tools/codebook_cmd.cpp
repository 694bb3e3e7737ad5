// favor codebook: a Transformer-VQ codebook learned from keys by k-means++ and Lloyd
// iterations (favor::Codebook::kmeans), one per head or shared, with the quantisation error
// of every iteration on stdout.
#include <fmt/core.h>

#include <memory>

#include "cli_common.hpp"
#include "commands.hpp"
#include "vq_args.hpp"

namespace favor::cli {
namespace {

struct CodebookArgs {
  std::string k, out, key_mask;
  int64_t codes = 0, iterations = 25;
  uint64_t seed = 0;
  bool shared = false;
};

void run(const CodebookArgs& a) {
  if (a.iterations < 0)
    throw Error("--iterations: " + std::to_string(a.iterations) + " must be >= 0");
  const InputTensor k = read_tensor(a.k, "--k");
  const Shape4& ks = k.shape();
  std::vector<uint8_t> mask;
  std::optional<KeyMaskView> mask_view;
  if (!a.key_mask.empty()) {
    mask = read_mask(a.key_mask, k.rank, ks[0], ks[2]);
    mask_view = KeyMaskView::contiguous(mask.data(), ks[0], ks[2]);
  }
  check_codes(a.codes, keys_per_codebook(ks, mask_view, a.shared), "--codes");
  {
    StagedOutputs probe;  // an unwritable --out fails now, before the k-means
    probe.stage(a.out, "", "--out");
  }
  KMeansOptions o;
  o.iterations = a.iterations;
  o.seed = a.seed;
  o.on_iteration = [](int64_t i, double error) {
    fmt::print("iteration {}: quantisation error {:.9g}\n", i, error);
    std::fflush(stdout);
  };
  const Codebook c = Codebook::kmeans(k.tensor, a.codes, o, !a.shared, mask_view);
  const Shape4 shape{1, c.heads(), c.codes(), c.d()};
  StagedOutputs outputs;
  outputs.stage(
      a.out, encode_npy_f32(codebook_file_shape(shape, a.shared || k.rank == 2), c.values().data()),
      "--out");
  outputs.commit();
}

}  // namespace

void add_codebook_command(CLI::App& app) {
  auto a = std::make_shared<CodebookArgs>();
  CLI::App* cmd = app.add_subcommand(
      "codebook",
      "Learn a Transformer-VQ codebook from keys by k-means (for attention --method vq)");
  cmd->add_option("--k", a->k, "keys .npy, [N, D] or [B, H, N, D], float32/float64")->required();
  cmd->add_option("--codes", a->codes, "codes c per codebook")->required();
  cmd->add_option("--out", a->out,
                  "codebook .npy, float32 [H, c, D] ([c, D] with --shared or 2-D keys)")
      ->required();
  cmd->add_option("--iterations", a->iterations, "Lloyd iterations after the k-means++ seeding")
      ->capture_default_str();
  cmd->add_option("--seed", a->seed, "64-bit seed of the k-means++ draws")->capture_default_str();
  cmd->add_flag("--shared", a->shared, "one codebook for all heads instead of one per head");
  cmd->add_option("--key-mask", a->key_mask,
                  "bool/0-1 .npy [B, N] ([N] for 2-D keys), true = key takes part");
  cmd->callback([a] { run(*a); });
}

}  // namespace favor::cli
