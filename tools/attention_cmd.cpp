// favor attention: FAVOR, Transformer-VQ or exact attention on .npy inputs.
#include <fmt/core.h>

#include <cmath>
#include <iostream>
#include <memory>

#include "cli_common.hpp"
#include "commands.hpp"
#include "fit_args.hpp"
#include "vq_args.hpp"

namespace favor::cli {
namespace {

struct AttentionArgs {
  std::string q, k, v, out, method = "favor", kernel = "positive", key_mask, accumulate = "f32";
  bool causal = false;
  std::optional<double> scale;
  ProjectionArgs projection;
  FitArgs fit;
  VQArgs vq;
};

// Transformer-VQ attention with the --codebook given or one learned from the keys (k-means,
// seeded by --seed); the codebook used is staged for --save-codebook.
Tensor vq(const AttentionArgs& a, const InputTensor& q, const InputTensor& k, const InputTensor& v,
          const std::optional<KeyMaskView>& mask, StagedOutputs& outputs) {
  if (!std::isfinite(a.vq.tau) || a.vq.tau < 0.0)
    throw Error("--vq-tau: " + fmt::format("{}", a.vq.tau) + " must be finite and >= 0");
  if (a.vq.block < 0)
    throw Error("--vq-block: " + std::to_string(a.vq.block) + " must be >= 1 (or 0: default)");
  if (a.vq.iterations < 0)
    throw Error("--vq-iterations: " + std::to_string(a.vq.iterations) + " must be >= 0");
  const Shape4& ks = k.tensor.shape();
  Tensor codebook;
  if (!a.vq.codebook.empty()) {
    codebook = read_codebook(a.vq.codebook, ks[1], ks[3], a.vq.codes);
  } else {
    if (!a.vq.codes)
      throw Error("--codes: vq attention without --codebook learns one and needs --codes C");
    if (a.causal) {
      throw Error(
          "--codebook: causal vq attention needs a codebook made beforehand (favor "
          "codebook on calibration keys); one learned from the sequence's own keys would "
          "let every position see future tokens");
    }
    check_codes(*a.vq.codes, keys_per_codebook(ks, mask, false), "--codes");
    KMeansOptions ko;
    ko.iterations = a.vq.iterations;
    ko.seed = a.projection.seed;
    const Codebook learned = Codebook::kmeans(k.tensor, *a.vq.codes, ko, true, mask);
    codebook = Tensor({1, learned.heads(), learned.codes(), learned.d()}, learned.values());
    std::cerr << fmt::format(
        "favor: note: no --codebook: learned {} codes per head by k-means on the keys (seed {}, "
        "{} iterations, quantisation error {:.4g})\n",
        learned.codes(), ko.seed, ko.iterations, learned.quantisation_error(k.tensor, mask));
  }
  VQOptions o;
  o.causal = a.causal;
  o.scale = a.scale;
  o.key_mask = mask;
  o.tau = a.vq.tau;
  o.block = a.vq.block;
  VQStats stats;
  Tensor y = vq_attention(q.tensor, k.tensor, v.tensor, codebook, o, &stats);
  if (stats.zero_rows > 0) {
    std::cerr << "favor: note: " << stats.zero_rows
              << " query rows had no visible key and were written as zeros\n";
  }
  if (!a.vq.save.empty()) {
    outputs.stage(
        a.vq.save,
        encode_npy_f32(codebook_file_shape(codebook.shape(), q.rank == 2), codebook.data()),
        "--save-codebook");
  }
  return y;
}

void run(const AttentionArgs& a) {
  if (a.method != "favor" && a.method != "exact" && a.method != "vq") {
    throw Error("--method: '" + a.method + "' is not a method; use favor, vq or exact");
  }
  const Kernel kernel = parse_kernel(a.kernel, "--kernel");
  const InputTensor q = read_tensor(a.q, "--q"), k = read_tensor(a.k, "--k"),
                    v = read_tensor(a.v, "--v");
  if (q.rank != k.rank || q.rank != v.rank)
    throw Error("--q, --k, --v: must all be 2-D or all be 4-D");
  std::vector<uint8_t> mask;
  std::optional<KeyMaskView> mask_view;
  if (!a.key_mask.empty()) {
    const auto& ks = k.tensor.shape();
    mask = read_mask(a.key_mask, q.rank, ks[0], ks[2]);
    mask_view = KeyMaskView::contiguous(mask.data(), ks[0], ks[2]);
  }
  StagedOutputs outputs;
  Tensor y;
  if (a.method == "exact") {
    if (a.accumulate != "f32" && a.accumulate != "f64")
      throw Error("--accumulate: '" + a.accumulate + "' must be f32 or f64");
    ExactOptions o;
    o.causal = a.causal;
    o.scale = a.scale;
    o.key_mask = mask_view;
    o.accumulation = a.accumulate == "f64" ? Accumulation::f64 : Accumulation::f32;
    y = exact_attention(q.tensor, k.tensor, v.tensor, o);
  } else if (a.method == "vq") {
    y = vq(a, q, k, v, mask_view, outputs);
  } else {
    const Projection w = make_projection(a.projection, q.tensor.shape()[3]);
    AttentionOptions o;
    o.kernel = kernel;
    o.causal = a.causal;
    o.scale = a.scale;
    o.key_mask = mask_view;
    o.fit = make_fit(a.fit, kernel, a.scale, q.tensor.shape()[3]);
    if (a.causal && data_adapted(kernel) && !o.fit) {
      throw Error("--fit-a / --fit-q,--fit-k: causal " + to_string(kernel) +
                  " attention needs a fit from calibration data (a fit to the sequence itself "
                  "would let every position see future tokens)");
    }
    AttentionStats stats;
    y = favor_attention(q.tensor, k.tensor, v.tensor, w, o, &stats);
    if (stats.zero_rows > 0) {
      std::cerr << "favor: note: " << stats.zero_rows
                << " query rows had no visible key or a non-positive denominator and were written "
                   "as zeros\n";
    }
    if (!a.projection.save.empty()) {
      outputs.stage(a.projection.save, encode_npy_f32({w.m(), w.d()}, w.data()),
                    "--save-projection");
    }
  }
  outputs.stage(a.out, encode_tensor(y, q.rank), "--out");
  outputs.commit();
}

}  // namespace

void add_attention_command(CLI::App& app) {
  auto args = std::make_shared<AttentionArgs>();
  CLI::App* cmd = app.add_subcommand(
      "attention",
      "Attention over .npy inputs: y = softmax(scale q.k) v, estimated by FAVOR, by "
      "Transformer-VQ (keys quantised to a codebook) or exact");
  cmd->add_option("--q", args->q, "queries .npy, [Nq, D] or [B, H, Nq, D], float32/float64")
      ->required();
  cmd->add_option("--k", args->k, "keys .npy, [Nk, D] or [B, H, Nk, D]")->required();
  cmd->add_option("--v", args->v, "values .npy, [Nk, Dv] or [B, H, Nk, Dv]")->required();
  cmd->add_option("--out", args->out, "output .npy, float32 [Nq, Dv] or [B, H, Nq, Dv]")
      ->required();
  cmd->add_option("--method", args->method, "favor | vq | exact")->capture_default_str();
  cmd->add_flag("--causal", args->causal, "query i attends to keys j <= i (needs Nq == Nk)");
  cmd->add_option("--kernel", args->kernel, "positive | trig | hyperbolic | favorpp | favorsharp")
      ->capture_default_str();
  cmd->add_option("--scale", args->scale, "temperature: softmax(scale q.k); default 1/sqrt(D)");
  cmd->add_option("--key-mask", args->key_mask,
                  "bool/0-1 .npy [B, Nk] ([Nk] for 2-D inputs), true = key takes part");
  cmd->add_option("--accumulate", args->accumulate, "exact method's accumulation: f32 | f64")
      ->capture_default_str();
  add_projection_options(cmd, args->projection);
  add_fit_options(cmd, args->fit);
  add_vq_options(cmd, args->vq);
  cmd->callback([args] { run(*args); });
}

}  // namespace favor::cli
