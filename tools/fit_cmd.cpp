// favor fit: a feature map fitted to .npy sequences by distillation (favor::fit_features),
// its held-out attention error per evaluated step on stdout, the map written as an .npz
// (map_file.hpp) for `favor attention --feature-map` and the Python package.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "cli_common.hpp"
#include "commands.hpp"
#include "io_names.hpp"

namespace favor::cli {
namespace {

struct FitCmdArgs {
  std::string q, k, v, out, heldout_q, heldout_k, heldout_v, kernel = "hedgehog",
                                                             learn = "weights,bias,lambda";
  double holdout = 0.25;
  int steps = 200, eval_every = 1;
  double lr = 0.01;
  std::optional<double> scale;
  bool causal = false, json = false;
  ProjectionArgs projection;
  CLI::Option* holdout_opt = nullptr;
};

// Batches [from, from + count) of a C-contiguous [B, H, N, D] tensor, without a copy.
TensorView batches(TensorView t, int64_t from, int64_t count) {
  const Shape4& s = t.shape;
  return TensorView::contiguous(t.data + from * s[1] * s[2] * s[3], {count, s[1], s[2], s[3]});
}

void parse_learn(const std::string& text, FitOptions& o) {
  o.learn_weights = o.learn_bias = o.learn_lambda = false;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty()) continue;
    if (item == "weights") {
      o.learn_weights = true;
    } else if (item == "bias") {
      o.learn_bias = true;
    } else if (item == "lambda") {
      o.learn_lambda = true;
    } else {
      throw Error("--learn: '" + item +
                  "' is not a parameter; use a comma list of weights, bias, lambda");
    }
  }
  if (!o.learn_weights && !o.learn_bias && !o.learn_lambda)
    throw Error("--learn: '" + text + "' names nothing to learn (weights, bias, lambda)");
}

// The library's option checks (check_fit_options), their errors naming the CLI's options.
FitOptions fit_options(const FitCmdArgs& a) {
  FitOptions o;
  o.steps = a.steps;
  o.learning_rate = a.lr;
  o.causal = a.causal;
  o.eval_every = a.eval_every;
  try {
    check_fit_options(o);
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const auto& [internal, option] :
         {std::pair<std::string, std::string>{"options.steps:", "--steps:"},
          {"options.learning_rate:", "--lr:"},
          {"options.eval_every:", "--eval-every:"}}) {
      if (what.rfind(internal, 0) == 0) throw Error(option + what.substr(internal.size()));
    }
    throw;
  }
  parse_learn(a.learn, o);
  return o;
}

Kernel fit_kernel_of(const std::string& name) {
  const Kernel kernel = parse_kernel(name, "--kernel");
  if (data_adapted(kernel)) {
    throw Error(
        "--kernel: " + name +
        " takes its parameters from its own fit; fit hedgehog, positive, trig or hyperbolic");
  }
  return kernel;
}

struct Split {
  InputTensor q, k, v, hq, hk, hv;  // hq, hk, hv empty: held-out batches of q, k, v
  FitData train, heldout;
  std::string described;
};

// Training and held-out sequences: the --heldout-* files, or the last --holdout fraction of
// the batch (at least one sequence each side).
Split split_data(const FitCmdArgs& a) {
  Split s;
  s.q = read_tensor(a.q, "--q");
  s.k = read_tensor(a.k, "--k");
  s.v = read_tensor(a.v, "--v");
  if (s.q.rank != s.k.rank || s.q.rank != s.v.rank)
    throw Error("--q, --k, --v: must all be 2-D or all be 4-D");
  const int given = !a.heldout_q.empty() + !a.heldout_k.empty() + !a.heldout_v.empty();
  if (given) {
    if (given != 3) throw Error("--heldout-q/--heldout-k/--heldout-v: give all three or none");
    if (a.holdout_opt->count())
      throw Error("--holdout: give --holdout or --heldout-q/--heldout-k/--heldout-v, not both");
    s.hq = read_tensor(a.heldout_q, "--heldout-q");
    s.hk = read_tensor(a.heldout_k, "--heldout-k");
    s.hv = read_tensor(a.heldout_v, "--heldout-v");
    s.train = {s.q.tensor, s.k.tensor, s.v.tensor, std::nullopt};
    s.heldout = {s.hq.tensor, s.hk.tensor, s.hv.tensor, std::nullopt};
    s.described = fmt::format("{} training and {} held-out sequences (--heldout-*)", s.q.shape()[0],
                              s.hq.shape()[0]);
    return s;
  }
  const int64_t b = s.q.shape()[0];
  if (b < 2 || s.k.shape()[0] != b || s.v.shape()[0] != b) {
    throw Error(
        "--holdout: needs a batch of B >= 2 sequences in --q, --k, --v to hold some out (B = " +
        std::to_string(b) + "); or give --heldout-q, --heldout-k, --heldout-v");
  }
  const int64_t held = heldout_count(a.holdout, b, "--holdout");  // favor.fit_features' rule
  const int64_t kept = b - held;
  s.train = {batches(s.q.tensor, 0, kept), batches(s.k.tensor, 0, kept),
             batches(s.v.tensor, 0, kept), std::nullopt};
  s.heldout = {batches(s.q.tensor, kept, held), batches(s.k.tensor, kept, held),
               batches(s.v.tensor, kept, held), std::nullopt};
  s.described =
      fmt::format("{} training and {} held-out sequences (the last of the batch, --holdout {})",
                  kept, held, a.holdout);
  return s;
}

nlohmann::json step_json(const FitStep& s) {
  return {{"step", s.step},
          {"loss", s.loss},
          {"heldout_error", s.heldout_error},
          {"seconds", s.seconds}};
}

void run(const FitCmdArgs& a) {
  const Kernel kernel = fit_kernel_of(a.kernel);
  const FitOptions options = fit_options(a);
  const Split data = split_data(a);
  {
    StagedOutputs probe;  // an unwritable --out fails now, before the fit
    probe.stage(a.out, "", "--out");
  }
  const Shape4& qs = data.train.q.shape;
  FeatureMap start(make_projection(a.projection, qs[3]), kernel);
  start.scale = a.scale;
  if (!a.json) {
    fmt::print("fitting a {} map, m = {}, D = {}, H = {}: {}; {} steps of Adam (lr {})\n",
               to_string(kernel), start.m(), qs[3], qs[1], data.described, a.steps, a.lr);
  }
  const FitResult r =
      fit_features(data.train, data.heldout, start, options, [&a](const FitStep& s) {
        if (a.json) return;
        fmt::print("step {:>5}  loss {:.6e}  held-out error {:.6f}  {:.2f} s\n", s.step, s.loss,
                   s.heldout_error, s.seconds);
        std::fflush(stdout);
      });
  StagedOutputs outputs;
  outputs.stage(a.out, encode_map_file(r.map), "--out");
  outputs.commit();
  const FitStep &first = r.history.front(), &last = r.history.back();
  const double ratio = last.heldout_error / first.heldout_error;
  if (a.json) {
    nlohmann::json history = nlohmann::json::array();
    for (const FitStep& s : r.history) history.push_back(step_json(s));
    const nlohmann::json out = {{"kernel", to_string(kernel)},
                                {"m", start.m()},
                                {"d", qs[3]},
                                {"heads", r.map.heads},
                                {"steps", a.steps},
                                {"learning_rate", a.lr},
                                {"causal", a.causal},
                                {"learn", a.learn},
                                {"history", history},
                                {"initial_heldout_error", first.heldout_error},
                                {"final_heldout_error", last.heldout_error},
                                {"ratio", ratio},
                                {"seconds", last.seconds},
                                {"out", a.out}};
    fmt::print("{}\n", out.dump(2));
    return;
  }
  fmt::print(
      "held-out error: {:.6f} at the start, {:.6f} after {} steps: ratio {:.4f} ({}); "
      "{:.2f} s; map written to {}\n",
      first.heldout_error, last.heldout_error, last.step, ratio,
      ratio <= 1.0 ? fmt::format("{:.2f}x lower", 1.0 / ratio)
                   : fmt::format("{:.2f}x higher: the fit made it worse", ratio),
      last.seconds, a.out);
}

}  // namespace

void add_fit_command(CLI::App& app) {
  auto a = std::make_shared<FitCmdArgs>();
  CLI::App* cmd = app.add_subcommand(
      "fit",
      "Fit a feature map to sequences by distillation (Adam on the attention-output error "
      "against exact attention) and save it as an .npz for attention --feature-map");
  cmd->add_option("--q", a->q, "queries .npy, [N, D] or [B, H, N, D], float32/float64")->required();
  cmd->add_option("--k", a->k, "keys .npy, [N, D] or [B, H, N, D]")->required();
  cmd->add_option("--v", a->v, "values .npy, [N, Dv] or [B, H, N, Dv]")->required();
  cmd->add_option("--out", a->out,
                  "the fitted map, .npz (kernel, scale, projection, heads, "
                  "weights, bias, lambda)")
      ->required();
  cmd->add_option("--heldout-q", a->heldout_q,
                  "held-out queries .npy (with --heldout-k, --heldout-v)");
  cmd->add_option("--heldout-k", a->heldout_k, "held-out keys .npy");
  cmd->add_option("--heldout-v", a->heldout_v, "held-out values .npy");
  a->holdout_opt = cmd->add_option("--holdout", a->holdout,
                                   "without --heldout-*: hold out this fraction of the batch (the "
                                   "last sequences; needs B >= 2)")
                       ->capture_default_str();
  cmd->add_option("--kernel", a->kernel, "hedgehog | positive | trig | hyperbolic")
      ->capture_default_str();
  auto& p = a->projection;
  p.features = 64;
  p.features_opt =
      cmd->add_option("--m,--features", p.features, "projections m (F = m or 2m features)")
          ->capture_default_str();
  p.kind_opt =
      cmd->add_option("--projection", p.kind,
                      "the starting W: iid | orthogonal | radial | qmc | sorf | simplex | dct")
          ->capture_default_str();
  p.norms_opt = cmd->add_option("--norms", p.norms, "chi | fixed | quantile (as for attention)")
                    ->capture_default_str();
  p.seed_opt =
      cmd->add_option("--seed", p.seed, "64-bit seed of the starting W")->capture_default_str();
  cmd->add_option("--projection-file", p.file, "start from this W (an [m, D] .npy) instead")
      ->excludes(p.features_opt)
      ->excludes(p.kind_opt)
      ->excludes(p.norms_opt)
      ->excludes(p.seed_opt);
  cmd->add_option("--scale", a->scale, "temperature: softmax(scale q.k); default 1/sqrt(D)");
  cmd->add_option("--steps", a->steps, "Adam steps")->capture_default_str();
  cmd->add_option("--lr", a->lr, "Adam's learning rate")->capture_default_str();
  cmd->add_option("--learn", a->learn, "what to learn, a comma list of weights, bias, lambda")
      ->capture_default_str();
  cmd->add_option("--eval-every", a->eval_every,
                  "held-out error every this many steps (and at the first and last; 0: only those)")
      ->capture_default_str();
  cmd->add_flag("--causal", a->causal, "fit causal attention (query i sees keys j <= i)");
  cmd->add_flag("--json", a->json, "print the history and summary as JSON instead of lines");
  auto quick = std::make_shared<bool>(false);
  cmd->add_flag("--quick", *quick,
                "at most 5 Adam steps (a smoke test of the command line as written: "
                "docs/reliability.md, \"Docs that run\")");
  cmd->callback([a, quick] {
    if (*quick) a->steps = std::min(a->steps, decltype(a->steps){5});
    run(*a);
  });
}

}  // namespace favor::cli
