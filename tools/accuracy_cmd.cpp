// favor accuracy: estimator x projection x m sweep against exact attention, over seeds, with
// the kernel MSE on a few pairs next to its closed form (math.md s.4). Options, the table,
// the JSON and the plot; the sweep itself is in accuracy_sweep.cpp.
#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>

#include "accuracy_sweep.hpp"
#include "commands.hpp"
#include "io_names.hpp"
#include "plot_runner.hpp"

namespace favor::cli {
namespace {

nlohmann::json meta(const AccuracyArgs& a, const std::vector<DataSetting>& data) {
  const nlohmann::json& first = data.front().meta;
  const int64_t d = first["d"].get<int64_t>();
  nlohmann::json names = nlohmann::json::array(), kinds = nlohmann::json::array(),
                 settings = nlohmann::json::array();
  for (const auto& e : a.estimators) names.push_back(to_string(parse_kernel(e, "--estimators")));
  for (const auto& p : a.projections)
    kinds.push_back(to_string(parse_projection_kind(p, "--projections")));
  for (const DataSetting& s : data) settings.push_back(s.meta);
  return {{"command", "accuracy"},
          {"version", FAVOR_VERSION_STRING},
          {"threads", num_threads()},
          {"batch", first["batch"]},
          {"heads", first["heads"]},
          {"n", first["n"]},
          {"nk", first["nk"]},
          {"d", d},
          {"dv", first["dv"]},
          {"scale", a.scale.value_or(1.0 / std::sqrt(double(d)))},
          {"causal", a.causal},
          {"seeds", a.seeds},
          {"norms", "chi"},
          {"data_seed", a.data_seed},
          {"kernel_pairs",
           {std::min<int64_t>(a.kernel_pairs, first["n"].get<int64_t>()),
            std::min<int64_t>(64, first["nk"].get<int64_t>())}},
          {"estimators", names},
          {"projections", kinds},
          {"features", a.features},
          {"sections", a.sections},
          {"vq_codes", a.vq_codes},
          {"vq_tau_rel", a.vq_tau_rel},
          {"vq_iterations", a.vq_iterations},
          {"vq_fit", a.vq_fit},
          {"data", settings}};
}

// The attention mode in the section headers: nothing for the default (bidirectional).
std::string causal_note(const nlohmann::json& m) {
  return m["causal"].get<bool>() ? " (causal: query i sees keys j <= i)" : "";
}

void print_header(const nlohmann::json& m) {
  fmt::print(
      "favor accuracy: FAVOR vs exact softmax attention{}, relative Frobenius error of the "
      "output (mean ± std over {} seeds)\n",
      causal_note(m), m["seeds"].get<int64_t>());
  fmt::print(
      "B = {}, H = {}, N = {}, Nk = {}, D = {}, Dv = {}, scale = {:.4g}; kernel MSE on {} x {} "
      "pairs of head 0, relative to mean SM^2; closed form: iid projections (math.md s.4), "
      "<= bound: orthogonal positive, m <= D\n",
      m["batch"].get<int64_t>(), m["heads"].get<int64_t>(), m["n"].get<int64_t>(),
      m["nk"].get<int64_t>(), m["d"].get<int64_t>(), m["dv"].get<int64_t>(),
      m["scale"].get<double>(), m["kernel_pairs"][0].get<int64_t>(),
      m["kernel_pairs"][1].get<int64_t>());
  fmt::print("{}\n", build_info());
  fmt::print("{:<30} {:<10} {:<10} {:>5} {:>5} {:>21} {:>10} {:>12} {:>5}\n", "data", "estimator",
             "projection", "m", "F", "attn rel err ± std", "kernel", "closed form", "zero");
  fmt::print("{:<30} {:<10} {:<10} {:>5} {:>5} {:>21} {:>10} {:>12} {:>5}\n", "", "", "", "", "",
             "", "rel MSE", "rel MSE", "rows");
}

void print_row(const nlohmann::json& r) {
  std::string closed = "-";
  if (r.contains("kernel_rel_mse_closed_form")) {
    closed = fmt::format("{:.3e}", r["kernel_rel_mse_closed_form"].get<double>());
  } else if (r.contains("kernel_rel_mse_upper_bound")) {
    closed = fmt::format("<= {:.2e}", r["kernel_rel_mse_upper_bound"].get<double>());
  }
  fmt::print("{:<30} {:<10} {:<10} {:>5} {:>5} {:>10.4g} ± {:<8.2g} {:>10.3e} {:>12} {:>5}\n",
             r["data"].get<std::string>(), r["estimator"].get<std::string>(),
             r["projection"].get<std::string>(), r["m"].get<int64_t>(),
             r["features"].get<int64_t>(), r["attention_rel_error"].get<double>(),
             r["attention_rel_error_std"].get<double>(), r["kernel_rel_mse"].get<double>(), closed,
             r["zero_rows"].get<int64_t>());
  std::fflush(stdout);
}

void print_vq_header(const nlohmann::json& m, bool after_favor) {
  if (after_favor) fmt::print("\n");
  fmt::print(
      "Transformer-VQ vs exact softmax attention{} on the second half of each sequence: "
      "codebooks by k-means ({} Lloyd iterations, seeds 0..{}) on {}, hard (tau = 0) and soft "
      "(tau = tau_rel x the mean quantisation error); FAVOR+ (positive, orthogonal) with m = c "
      "beside it, same seeds\n",
      causal_note(m), m["vq_iterations"].get<int64_t>(), m["seeds"].get<int64_t>() - 1,
      m["vq_fit"] == "same" ? "the evaluated keys (in-sample)"
                            : "the keys of the first half (held out)");
  fmt::print("{:<30} {:>5} {:>7} {:>9} {:>21} {:>21} {:>10} {:>5}\n", "data", "c", "tau_rel", "tau",
             "vq rel err ± std", "favor+ m=c err ± std", "quant err", "zero");
}

void print_vq_row(const nlohmann::json& r) {
  fmt::print(
      "{:<30} {:>5} {:>7.3g} {:>9.3g} {:>10.4g} ± {:<8.2g} {:>10.4g} ± {:<8.2g} {:>10.4g} "
      "{:>5}\n",
      r["data"].get<std::string>(), r["codes"].get<int64_t>(), r["tau_rel"].get<double>(),
      r["tau"].get<double>(), r["attention_rel_error"].get<double>(),
      r["attention_rel_error_std"].get<double>(), r["favor_rel_error"].get<double>(),
      r["favor_rel_error_std"].get<double>(), r["quantisation_error"].get<double>(),
      r["zero_rows"].get<int64_t>());
  std::fflush(stdout);
}

void print_maps_header(const nlohmann::json& m, bool after_other) {
  if (after_other) fmt::print("\n");
  fmt::print(
      "Feature maps vs exact softmax attention{} on the second half of each sequence (held "
      "out); the fitted maps (fit_features) train on the first half; F features each "
      "(hedgehog: m = F / 2 projections)\n",
      causal_note(m));
  fmt::print("{:<30} {:<13} {:>5} {:>5} {:>21} {:>12} {:>9}\n", "data", "method", "F", "m",
             "rel err ± std", "before fit", "fit s");
}

void print_maps_row(const nlohmann::json& r) {
  const bool fitted = r["fitted"].get<bool>();
  fmt::print("{:<30} {:<13} {:>5} {:>5} {:>10.4g} ± {:<8.2g} {:>12} {:>9}\n",
             r["data"].get<std::string>(), r["method"].get<std::string>(),
             r["features"].get<int64_t>(), r["m"].get<int64_t>(),
             r["attention_rel_error"].get<double>(), r["attention_rel_error_std"].get<double>(),
             fitted ? fmt::format("{:.4g}", r["initial_rel_error"].get<double>()) : "-",
             fitted ? fmt::format("{:.2f}", r["fit_seconds"].get<double>()) : "-");
  std::fflush(stdout);
}

void run(const AccuracyArgs& a) {
  const std::vector<DataSetting> data = make_data_settings(a);
  if (!a.plot.empty() && !a.has("favor"))
    throw Error("--plot: draws the favor section; add favor to --sections");
  for (const auto& [path, option] : {std::pair{a.out, "--out"}, std::pair{a.plot, "--plot"}}) {
    if (path.empty()) continue;
    StagedOutputs probe;  // fails now, naming the option, rather than after the sweep
    probe.stage(path, "", option);
  }
  const nlohmann::json m = meta(a, data);
  if (!a.json && a.has("favor")) print_header(m);
  const bool show_progress = a.progress || ::isatty(STDERR_FILENO);
  const Progress progress = [show_progress](int64_t i, int64_t total, const std::string& e,
                                            const std::string& p, int64_t features) {
    if (show_progress) fmt::print(stderr, "accuracy: {}/{} {}/{} m={}\n", i, total, e, p, features);
  };
  const RecordSink sink = [&a](const nlohmann::json& r) {
    if (!a.json) print_row(r);
  };
  nlohmann::json result = {{"meta", m}, {"records", nlohmann::json::array()}};
  if (a.has("favor")) result["records"] = run_accuracy_sweep(a, data, progress, sink);
  if (a.has("vq")) {
    if (!a.json) print_vq_header(m, a.has("favor"));
    const VQProgress vq_progress = [show_progress](int64_t i, int64_t total, int64_t codes) {
      if (show_progress) fmt::print(stderr, "accuracy: vq {}/{} c={}\n", i, total, codes);
    };
    const RecordSink vq_sink = [&a](const nlohmann::json& r) {
      if (!a.json) print_vq_row(r);
    };
    result["vq_records"] = run_vq_sweep(a, data, vq_progress, vq_sink);
  }
  if (a.has("maps")) {
    if (!a.json) print_maps_header(m, a.has("favor") || a.has("vq"));
    const MapsProgress maps_progress = [show_progress](int64_t i, int64_t total,
                                                       const std::string& method, int64_t F) {
      if (show_progress) fmt::print(stderr, "accuracy: maps {}/{} {} F={}\n", i, total, method, F);
    };
    const RecordSink maps_sink = [&a](const nlohmann::json& r) {
      if (!a.json) print_maps_row(r);
    };
    result["maps_records"] = run_maps_sweep(a, data, maps_progress, maps_sink);
  }
  const std::string text = result.dump(2) + "\n";
  if (a.json) fmt::print("{}", text);
  StagedOutputs outputs;
  if (!a.out.empty()) outputs.stage(a.out, text, "--out");
  if (!a.plot.empty()) draw_plot(accuracy_plot_script(), text, a.plot, outputs);
  outputs.commit();
}

}  // namespace

void add_accuracy_command(CLI::App& app) {
  auto a = std::make_shared<AccuracyArgs>();
  CLI::App* cmd = app.add_subcommand(
      "accuracy",
      "Accuracy study: attention error vs exact softmax and kernel MSE (with closed forms) over "
      "estimators x projections x m x seeds");
  cmd->add_flag("--json", a->json, "print {meta, records} as JSON instead of the table");
  cmd->add_option("--out", a->out, "also write the JSON to this file");
  cmd->add_option("--plot", a->plot,
                  "draw error vs m (log-log) into this PNG (matplotlib, plot_accuracy.py)");
  cmd->add_flag("--progress", a->progress,
                "progress lines on stderr (default: only when stderr is a terminal)");
  cmd->add_option("--estimators", a->estimators,
                  "positive | trig | hyperbolic | favorpp | favorsharp")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--projections", a->projections,
                  "iid | orthogonal | radial | qmc | sorf | simplex | dct (chi norms)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--features", a->features, "projection counts m (F = 2m for trig, hyperbolic)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--seeds", a->seeds, "projection seeds s = 0 .. seeds-1 per combination")
      ->capture_default_str();
  cmd->add_option("--scale", a->scale, "temperature: softmax(scale q.k); default 1/sqrt(D)");
  cmd->add_flag("--causal", a->causal,
                "causal attention in every section (query i sees keys j <= i), exact and "
                "approximate; needs as many queries as keys");
  cmd->add_option("--kernel-pairs", a->kernel_pairs,
                  "kernel MSE over the first this many queries x first 64 keys of head 0")
      ->capture_default_str();
  auto* n = cmd->add_option("--n", a->n, "synthetic: tokens N")->capture_default_str();
  auto* d = cmd->add_option("--d", a->d, "synthetic: head dim D")->capture_default_str();
  auto* dv =
      cmd->add_option("--dv", a->dv, "value dim Dv (synthetic values)")->capture_default_str();
  auto* norm = cmd->add_option("--qk-norm", a->qk_norms,
                               "synthetic: row norms |q| = |k|, one setting each (default "
                               "D^(1/4): |x| = |y| = 1 at the default scale)")
                   ->delimiter(',');
  auto* cos = cmd->add_option("--qk-cos", a->qk_cos,
                              "synthetic: expected cosine between a query and a key, in [-1, 1], "
                              "one setting each (see docs/cli.md)")
                  ->delimiter(',')
                  ->capture_default_str();
  cmd->add_option("--data-seed", a->data_seed, "seed of the synthetic q, k and v")
      ->capture_default_str();
  auto* q =
      cmd->add_option("--q", a->q, "queries .npy [N, D] or [B, H, N, D] instead of synthetic");
  auto* k = cmd->add_option("--k", a->k, "keys .npy [Nk, D] or [B, H, Nk, D] (with --q)");
  auto* v = cmd->add_option("--v", a->v,
                            "values .npy [Nk, Dv] or [B, H, Nk, Dv] (default: "
                            "synthetic Gaussian)");
  cmd->add_option("--sections", a->sections,
                  "favor (estimators x projections x m), vq (Transformer-VQ vs FAVOR+ at m = c) "
                  "and/or maps (DCT, WPFF, fitted positive and Hedgehog maps vs FAVOR+, FAVOR++, "
                  "FAVOR# at equal F, held out)")
      ->delimiter(',')
      ->capture_default_str();
  std::vector<CLI::Option*> vq_options{
      cmd->add_option("--vq-codes", a->vq_codes,
                      "vq: codebook sizes c (clipped to the keys per head)")
          ->delimiter(',')
          ->capture_default_str(),
      cmd->add_option("--vq-tau-rel", a->vq_tau_rel,
                      "vq: soft-VQ temperatures in units of the mean quantisation error; 0 = hard")
          ->delimiter(',')
          ->capture_default_str(),
      cmd->add_option("--vq-iterations", a->vq_iterations, "vq: Lloyd iterations of the k-means")
          ->capture_default_str(),
      cmd->add_option("--vq-fit", a->vq_fit,
                      "vq: heldout = k-means on the first half of each sequence, attention on "
                      "the second; same = k-means on the evaluated keys (in-sample)")
          ->check(CLI::IsMember({"heldout", "same"}))
          ->capture_default_str()};
  cmd->add_option("--maps-features", a->maps_features,
                  "maps: feature counts F (hedgehog uses m = F / 2 projections)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--maps-steps", a->maps_steps, "maps: Adam steps of each fit")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--maps-lr", a->maps_lr, "maps: Adam learning rate of each fit")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  q->needs(k)->excludes(n)->excludes(d)->excludes(norm)->excludes(cos);
  k->needs(q);
  v->needs(q)->excludes(dv);
  auto quick = std::make_shared<bool>(false);
  cmd->add_flag(
      "--quick", *quick,
      "two seeds, a few Adam and Lloyd steps, and small sizes and sets (two estimators, one "
      "projection) for every one not given "
      "(a smoke test of the command line as written: docs/reliability.md, \"Docs that "
      "run\")");
  cmd->callback([a, vq_options, cmd, quick] {
    for (const CLI::Option* o : vq_options) a->vq_options_given |= o->count() > 0;
    if (*quick) {  // effort is cut whatever was asked; sizes only where none was given
      a->seeds = std::min<int64_t>(a->seeds, 2);
      a->maps_steps = std::min(a->maps_steps, decltype(a->maps_steps){5});
      a->vq_iterations = std::min<int64_t>(a->vq_iterations, 3);
      if (cmd->count("--features") == 0) a->features = {16, 64};
      if (cmd->count("--estimators") == 0) a->estimators = {"positive", "favorsharp"};
      if (cmd->count("--projections") == 0) a->projections = {"orthogonal"};
      if (cmd->count("--n") == 0) a->n = 128;
      if (cmd->count("--vq-codes") == 0) a->vq_codes = {16};
      if (cmd->count("--maps-features") == 0) a->maps_features = {32};
      if (cmd->count("--kernel-pairs") == 0) a->kernel_pairs = 8;
    }
    run(*a);
  });
}

}  // namespace favor::cli
