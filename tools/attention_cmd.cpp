// favor attention: FAVOR, Transformer-VQ or exact attention on .npy inputs.
#include <fmt/core.h>

#include <cmath>
#include <iostream>
#include <memory>

#include "attention_args.hpp"
#include "commands.hpp"
#include "io_names.hpp"

namespace favor::cli {

FeatureMap attention_feature_map(const AttentionArgs& a, const Shape4& qs) {
  const int64_t d = qs[3], heads = qs[1];
  if (!a.feature_map.empty()) {
    const auto& p = a.projection;
    const std::pair<bool, const char*> replaced[] = {
        {a.kernel_opt->count() > 0, "--kernel"},
        {p.features_opt->count() > 0, "--features"},
        {p.kind_opt->count() > 0, "--projection"},
        {p.norms_opt->count() > 0, "--norms"},
        {p.seed_opt->count() > 0, "--seed"},
        {!p.file.empty(), "--projection-file"},
        {a.scale_opt->count() > 0, "--scale"},
        {!a.feature_weights.empty(), "--feature-weights"},
        {a.fit.a.has_value(), "--fit-a"},
        {!a.fit.q.empty() || !a.fit.k.empty(), "--fit-q/--fit-k"}};
    for (const auto& [given, name] : replaced) {
      if (given) {
        throw Error(
            std::string("--feature-map: the map file gives the kernel, projection, scale and "
                        "weights; drop ") +
            name);
      }
    }
    FeatureMap map = read_map_file(a.feature_map, "--feature-map");
    if (map.d() != d) {
      throw Error("--feature-map: " + a.feature_map + ": its projection is " +
                  std::to_string(map.m()) + " x " + std::to_string(map.d()) +
                  " but the inputs have D = " + std::to_string(d));
    }
    if (map.heads != 1 && map.heads != heads && map.heads != qs[0] * heads) {
      throw Error("--feature-map: " + a.feature_map + ": has " + std::to_string(map.heads) +
                  " parameter sets; the inputs need 1, H = " + std::to_string(heads) +
                  " or B*H = " + std::to_string(qs[0] * heads));
    }
    return map;
  }
  const Kernel kernel = parse_kernel(a.kernel, "--kernel");
  FeatureMap map(make_projection(a.projection, d), kernel);
  map.scale = a.scale;
  map.fit = make_fit(a.fit, kernel, a.scale, d);
  if (a.causal && data_adapted(kernel) && !map.fit) {
    throw Error("--fit-a / --fit-q,--fit-k: causal " + to_string(kernel) +
                " attention needs a fit from calibration data (a fit to the sequence itself "
                "would let every position see future tokens)");
  }
  if (!a.feature_weights.empty()) {
    if (data_adapted(kernel)) {
      throw Error(
          "--feature-weights: a " + to_string(kernel) +
          " map takes its weights from its fit; use positive, trig, hyperbolic or hedgehog");
    }
    map.lambda =
        read_feature_weights(a.feature_weights, "--feature-weights", map.m(), heads, map.heads);
  }
  return map;
}

std::vector<double> attention_decay(const AttentionArgs& a, int64_t heads) {
  if (a.decay.empty()) return {};
  if (!a.causal) throw Error("--decay: decay gamma^(i - j) is for causal attention; add --causal");
  if (a.decay.size() != 1 && static_cast<int64_t>(a.decay.size()) != heads) {
    throw Error("--decay: " + std::to_string(a.decay.size()) +
                " values; give 1 or one per head (H = " + std::to_string(heads) + ")");
  }
  for (double g : a.decay) {
    if (!(g > 0.0 && g <= 1.0))
      throw Error("--decay: " + fmt::format("{}", g) + " must lie in (0, 1]");
  }
  return a.decay;
}

void check_method(const AttentionArgs& a) {
  if (a.method != "favor" && a.method != "exact" && a.method != "vq") {
    throw Error("--method: '" + a.method + "' is not a method; use favor, vq or exact");
  }
  if (a.method == "favor") return;
  for (const auto& [given, name] :
       {std::pair{!a.feature_map.empty(), "--feature-map"},
        std::pair{!a.feature_weights.empty(), "--feature-weights"},
        std::pair{!a.decay.empty(), "--decay"}, std::pair{a.window != 0, "--window"},
        std::pair{a.sinks != 0, "--sinks"}}) {
    if (given) throw Error(std::string(name) + ": only --method favor takes it");
  }
}

VQOptions attention_vq_options(const AttentionArgs& a) {
  if (!std::isfinite(a.vq.tau) || a.vq.tau < 0.0)
    throw Error("--vq-tau: " + fmt::format("{}", a.vq.tau) + " must be finite and >= 0");
  if (a.vq.block < 0)
    throw Error("--vq-block: " + std::to_string(a.vq.block) + " must be >= 1 (or 0: default)");
  VQOptions o;
  o.causal = a.causal;
  o.scale = a.scale;
  o.tau = a.vq.tau;
  o.block = a.vq.block;
  return o;
}

namespace {

// Transformer-VQ attention with the --codebook given or one learned from the keys (k-means,
// seeded by --seed); the codebook used is staged for --save-codebook.
Tensor vq(const AttentionArgs& a, const InputTensor& q, const InputTensor& k, const InputTensor& v,
          const std::optional<KeyMaskView>& mask, StagedOutputs& outputs) {
  VQOptions o = attention_vq_options(a);
  o.key_mask = mask;
  if (a.vq.iterations < 0)
    throw Error("--vq-iterations: " + std::to_string(a.vq.iterations) + " must be >= 0");
  const Shape4& ks = k.shape();
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
  if (a.distributed) {  // an error in a build without MPI (tools/no_distributed.cpp)
    run_distributed_attention(a);
    return;
  }
  check_method(a);
  parse_kernel(a.kernel, "--kernel");  // a bad name fails before any file is read
  const InputTensor q = read_tensor(a.q, "--q"), k = read_tensor(a.k, "--k"),
                    v = read_tensor(a.v, "--v");
  if (q.rank != k.rank || q.rank != v.rank)
    throw Error("--q, --k, --v: must all be 2-D or all be 4-D");
  std::vector<uint8_t> mask;
  std::optional<KeyMaskView> mask_view;
  if (!a.key_mask.empty()) {
    const auto& ks = k.shape();
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
    const FeatureMap map = attention_feature_map(a, q.shape());
    AttentionOptions o;
    o.causal = a.causal;
    o.key_mask = mask_view;
    o.decay = attention_decay(a, q.shape()[1]);
    o.window = a.window;
    o.sinks = a.sinks;
    AttentionStats stats;
    y = favor_attention(q.tensor, k.tensor, v.tensor, map, o, &stats);
    if (stats.zero_rows > 0) {
      std::cerr << "favor: note: " << stats.zero_rows
                << " query rows had no visible key or a non-positive denominator and were written "
                   "as zeros\n";
    }
    if (!a.projection.save.empty()) {
      const Projection& w = map.projection;
      outputs.stage(a.projection.save, encode_npy_f32({w.m(), w.d()}, w.data()),
                    "--save-projection");
    }
  }
  stage_tensor(outputs, a.out, y, q.rank, "--out");
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
  cmd->add_flag("--distributed", args->distributed,
                "sequence-parallel over the ranks of mpirun -np P: each rank reads, computes and "
                "writes its slice of the sequence (--method favor or vq; needs a build with MPI)");
  args->kernel_opt =
      cmd->add_option("--kernel", args->kernel,
                      "positive | trig | hyperbolic | favorpp | favorsharp | hedgehog")
          ->capture_default_str();
  args->scale_opt =
      cmd->add_option("--scale", args->scale, "temperature: softmax(scale q.k); default 1/sqrt(D)");
  cmd->add_option("--key-mask", args->key_mask,
                  "bool/0-1 .npy [B, Nk] ([Nk] for 2-D inputs), true = key takes part");
  cmd->add_option("--accumulate", args->accumulate, "exact method's accumulation: f32 | f64")
      ->capture_default_str();
  add_projection_options(cmd, args->projection);
  add_fit_options(cmd, args->fit);
  add_vq_options(cmd, args->vq);
  cmd->add_option(
      "--feature-map", args->feature_map,
      "a fitted map (.npz from favor fit or favor.fit_features): kernel, projection, "
      "scale and learned weights, instead of --kernel, --features, --projection, --scale");
  cmd->add_option("--feature-weights", args->feature_weights,
                  "feature weights lambda (WPFF): a .npy [m] or [H, m], one per projection row");
  cmd->add_option(
         "--decay", args->decay,
         "causal decay gamma^(i - j): one gamma in (0, 1] or one per head, comma-separated")
      ->delimiter(',');
  cmd->add_option("--window", args->window,
                  "hybrid attention: exact softmax on each query's last W keys (causal; "
                  "bidirectional |i - j| < W), the estimator beyond (needs Nq == Nk)")
      ->capture_default_str();
  cmd->add_option("--sinks", args->sinks,
                  "hybrid attention: exact softmax on the first S visible keys as well")
      ->capture_default_str();
  cmd->callback([args] { run(*args); });
}

}  // namespace favor::cli
