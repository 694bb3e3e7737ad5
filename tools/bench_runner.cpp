// favor bench's shared rows (tools/bench_runner.hpp): FAVOR and exact attention across
// lengths, threads and passes, with GFLOP/s from the cost model (bench/cost_model.hpp) and the
// same run's large-sgemm rate as the machine's yardstick.
#include "bench_runner.hpp"

#include <fmt/core.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "bench_sections.hpp"
#include "blas_yardstick.hpp"
#include "cli_common.hpp"
#include "plot_runner.hpp"

namespace favor::cli {

using namespace favor::bench;

double status_mib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0)
      return std::strtod(line.c_str() + std::strlen(field), nullptr) / 1024.0;
  }
  return 0.0;
}

nlohmann::json timed_record(const char* method, bool causal, int64_t n, int64_t bh, int threads,
                            const Measured& t, double flops) {
  return {{"method", method},
          {"causal", causal},
          {"n", n},
          {"bh", bh},
          {"threads", threads},
          {"seconds", t.seconds},
          {"gflops", flops / t.seconds / 1e9},
          {"tokens_per_s", double(n * bh) / t.seconds},
          {"peak_heap_mb", t.heap_mb},
          {"rss_growth_mb", t.rss_mb}};
}

BenchRunner::BenchRunner(const BenchArgs& a) : a_(a), kernel_(parse_kernel(a.kernel, "--kernel")) {}

void BenchRunner::run() {
  header();
  sgemm();
  for (const BenchSection& section : bench_sections()) {
    section_ = section.name;
    if (a_.has(section.name)) section.run(*this);
  }
}

Problem BenchRunner::problem(int64_t bh, int64_t n, std::optional<Kernel> kernel) const {
  return {bh, n, a_.d, a_.d, a_.m, feature_count(kernel.value_or(kernel_), a_.m)};
}

std::tuple<Tensor, Tensor, Tensor> BenchRunner::inputs(int64_t bh, int64_t n, uint64_t seed) const {
  const double norm = std::pow(double(a_.d), 0.25);
  return {gaussian_rows({1, bh, n, a_.d}, 11 + seed, norm),
          gaussian_rows({1, bh, n, a_.d}, 22 + seed, norm),
          gaussian_rows({1, bh, n, a_.d}, 33 + seed)};
}

void BenchRunner::header() {
  if (a_.json) return;
  fmt::print("favor bench: D = Dv = {}, m = {}, kernel {}; {}\n", a_.d, a_.m, to_string(kernel_),
             build_info());
  fmt::print("{:>7} {:>4} {:>6} {:>6} {:>3} {:>3} {:>11} {:>9} {:>7} {:>6} {:>12} {:>9} {:>9}\n",
             "method", "pass", "causal", "N", "BH", "thr", "seconds", "GFLOP/s", "%sgemm", "%best",
             "tokens/s", "heap MiB", "rss MiB");
}

void BenchRunner::emit(nlohmann::json r) {
  r["section"] = section_;
  r["d"] = a_.d;
  r["m"] = a_.m;
  if (!r.contains("kernel")) r["kernel"] = to_string(kernel_);
  if (!r.contains("pass")) r["pass"] = "forward";
  if (tag_.is_object()) r.update(tag_);
  // Rows without a cost model carry "gflops": null.
  const bool rated = r["gflops"].is_number();
  const double pct =
      rated && sgemm_gflops_ > 0 ? 100.0 * r["gflops"].get<double>() / sgemm_gflops_ : 0.0;
  const double best = rated && best_sgemm_gflops_ > 0
                          ? 100.0 * r["gflops"].get<double>() / best_sgemm_gflops_
                          : 0.0;
  r["percent_of_sgemm"] = rated ? nlohmann::json(pct) : nlohmann::json(nullptr);
  r["percent_of_best_sgemm"] = rated ? nlohmann::json(best) : nlohmann::json(nullptr);
  if (!a_.json) {
    fmt::print(
        "{:>7} {:>4} {:>6} {:>6} {:>3} {:>3} {:>11.5f} {:>9} {:>7} {:>6} {:>12.4g} {:>9.1f} "
        "{:>9.1f}\n",
        r.contains("library") && r["library"] != "favor" ? r["library"].get<std::string>()
                                                         : r["method"].get<std::string>(),
        r["pass"].get<std::string>() == "backward" ? "bwd" : "fwd",
        r["causal"].get<bool>() ? "yes" : "no", r["n"].get<int64_t>(), r["bh"].get<int64_t>(),
        r["threads"].get<int>(), r["seconds"].get<double>(),
        rated ? fmt::format("{:.1f}", r["gflops"].get<double>()) : "-",
        rated ? fmt::format("{:.0f}%", pct) : "-", rated ? fmt::format("{:.0f}%", best) : "-",
        r["tokens_per_s"].get<double>(), r["peak_heap_mb"].get<double>(),
        r["rss_growth_mb"].get<double>());
    std::fflush(stdout);
  }
  records_.push_back(std::move(r));
}

void BenchRunner::sgemm() {
  const int64_t n = a_.sgemm_n;
  std::vector<float> A(n * n, 1.0f), B(n * n, 0.5f), C(n * n, 0.0f);
  const Measured t = [&] {
    const BlasThreads lend(num_threads());
    return measure([&] { sgemm_square(n, A.data(), B.data(), C.data()); }, a_.repeats, a_.min_time);
  }();
  sgemm_gflops_ = best_sgemm_gflops_ = sgemm_flops(n) / t.seconds / 1e9;
  nlohmann::json row = {{"method", "sgemm"},
                        {"library", "favor"},
                        {"blas", blas_config()},
                        {"causal", false},
                        {"n", n},
                        {"bh", 1},
                        {"threads", num_threads()},
                        {"seconds", t.seconds},
                        {"gflops", sgemm_gflops_},
                        {"tokens_per_s", 0.0},
                        {"peak_heap_mb", t.heap_mb},
                        {"rss_growth_mb", t.rss_mb}};
  // The peers: numpy's and torch's BLAS in the same run (another process, one at a time).
  nlohmann::json peers = nlohmann::json::object();
  if (a_.sgemm_peers) {
    const std::string text = sgemm_peers_json(n, num_threads(), a_.repeats, a_.min_time);
    if (!text.empty()) peers = nlohmann::json::parse(text, nullptr, false);
    if (!peers.is_object()) peers = nlohmann::json::object();
  }
  for (const auto& [library, peer] : peers.items())
    best_sgemm_gflops_ = std::max(best_sgemm_gflops_, peer["gflops"].get<double>());
  emit(row);
  for (const auto& [library, peer] : peers.items()) {
    const double gflops = peer["gflops"].get<double>();
    nlohmann::json r = row;
    r["library"] = library;
    r["blas"] = peer["blas"];
    r["gflops"] = gflops;
    r["seconds"] = sgemm_flops(n) / gflops / 1e9;
    r["peak_heap_mb"] = r["rss_growth_mb"] = 0.0;
    emit(r);
  }
  if (!a_.json) {
    std::string text = fmt::format("yardstick: favor's BLAS {:.1f} GFLOP/s", sgemm_gflops_);
    for (const auto& [library, peer] : peers.items())
      text += fmt::format("; {} ({}) {:.1f}", library, peer["blas"].get<std::string>(),
                          peer["gflops"].get<double>());
    if (peers.empty())
      text += a_.sgemm_peers ? "; numpy, torch: not measured (no Python with them)"
                             : "; peers not measured (--no-sgemm-peers)";
    fmt::print("{}: %sgemm is against favor's BLAS, %best against {:.1f}\n", text,
               best_sgemm_gflops_);
  }
}

// Bidirectional FAVOR++ / FAVOR# fit themselves inside the timed call; causal ones are given a
// fit made beforehand (from calibration data in real use), not timed here.
double BenchRunner::favor_row(int64_t bh, int64_t n, bool causal, int threads,
                              std::optional<Kernel> kernel, nlohmann::json extra) {
  // Named references, not a structured binding: clang++ 14 cannot capture bindings in
  // lambdas (C++20 P1091, clang 16).
  const auto qkv = inputs(bh, n);
  const Tensor &q = std::get<0>(qkv), &k = std::get<1>(qkv), &v = std::get<2>(qkv);
  const Projection w = Projection::draw(a_.m, a_.d, {ProjectionKind::orthogonal, NormMode::chi, 0});
  Tensor out({1, bh, n, a_.d}, 0.0f);
  AttentionOptions o;
  o.kernel = kernel.value_or(kernel_);
  o.causal = causal;
  if (causal && data_adapted(o.kernel)) o.fit = fit_kernel(o.kernel, q, k);
  const int saved = num_threads();
  set_num_threads(threads);
  const Measured t =
      measure([&] { favor_attention(q, k, v, w, out.mutable_view(), o); }, a_.repeats, a_.min_time);
  set_num_threads(saved);
  const double flops = favor_flops(problem(bh, n, o.kernel), causal, kernel_info().causal_chunk);
  nlohmann::json r = timed_record("favor", causal, n, bh, threads, t, flops);
  if (kernel) r["kernel"] = to_string(*kernel);
  if (extra.is_object()) r.update(extra);
  emit(std::move(r));
  return t.seconds;
}

double BenchRunner::exact_row(int64_t bh, int64_t n, bool causal) {
  const auto qkv = inputs(bh, n);
  const Tensor &q = std::get<0>(qkv), &k = std::get<1>(qkv), &v = std::get<2>(qkv);
  Tensor out({1, bh, n, a_.d}, 0.0f);
  ExactOptions o;
  o.causal = causal;
  const Measured t =
      measure([&] { exact_attention(q, k, v, out.mutable_view(), o); }, a_.repeats, a_.min_time);
  emit(timed_record("exact", causal, n, bh, num_threads(), t, exact_flops(problem(bh, n), causal)));
  return t.seconds;
}

// Backward rows: the gradients dq, dk, dv are returned (allocated by the call), so the heap
// figure includes them; `extra_heap_mb` is the heap beyond those outputs. `ratio_to_forward`
// divides by the forward time measured just before.
void BenchRunner::backward_record(const char* method, int64_t bh, int64_t n, bool causal,
                                  const Measured& t, double flops, double forward_seconds,
                                  bool context) {
  const double outputs_mb = double(bh * n * (2 * a_.d + a_.d)) * 4.0 / (1024.0 * 1024.0);
  nlohmann::json r = timed_record(method, causal, n, bh, num_threads(), t, flops);
  r.update({{"pass", "backward"},
            {"extra_heap_mb", t.heap_mb - outputs_mb},
            {"context", context},
            {"ratio_to_forward", t.seconds / forward_seconds}});
  emit(std::move(r));
}

// Also the training pattern, a forward that saves its context (bidirectional: the key state;
// causal: the chunk states and rows, save_causal_states) and a backward that uses it; its
// ratio is to that forward.
double BenchRunner::favor_backward_row(int64_t bh, int64_t n, bool causal, double forward_seconds,
                                       bool with_context) {
  const auto qkv = inputs(bh, n);
  const Tensor &q = std::get<0>(qkv), &k = std::get<1>(qkv), &v = std::get<2>(qkv);
  const Tensor dy = gaussian_rows({1, bh, n, a_.d}, 44);
  const Projection w = Projection::draw(a_.m, a_.d, {ProjectionKind::orthogonal, NormMode::chi, 0});
  AttentionOptions o;
  o.kernel = kernel_;
  o.causal = causal;
  if (causal && data_adapted(kernel_)) o.fit = fit_kernel(kernel_, q, k);  // as favor_row
  const Problem prob = problem(bh, n);
  const int64_t chunk = kernel_info().causal_chunk;
  const Measured t =
      measure([&] { favor_attention_backward(q, k, v, dy, w, o); }, a_.repeats, a_.min_time);
  backward_record("favor", bh, n, causal, t, favor_backward_flops(prob, causal, chunk),
                  forward_seconds, false);
  if (with_context) {
    Tensor out({1, bh, n, a_.d});
    AttentionContext ctx;
    o.save_causal_states = causal;
    const Measured f = measure([&] { favor_attention(q, k, v, w, out.mutable_view(), o, &ctx); },
                               a_.repeats, a_.min_time);
    const Measured b = measure([&] { favor_attention_backward(q, k, v, dy, w, o, false, &ctx); },
                               a_.repeats, a_.min_time);
    backward_record("favor", bh, n, causal, b,
                    causal ? favor_causal_backward_flops_with_context(prob, chunk)
                           : favor_backward_flops_with_context(prob),
                    f.seconds, true);
  }
  return t.seconds;
}

double BenchRunner::exact_backward_row(int64_t bh, int64_t n, bool causal, double forward_seconds) {
  const auto qkv = inputs(bh, n);
  const Tensor &q = std::get<0>(qkv), &k = std::get<1>(qkv), &v = std::get<2>(qkv);
  const Tensor dy = gaussian_rows({1, bh, n, a_.d}, 44);
  ExactOptions o;
  o.causal = causal;
  const Measured t =
      measure([&] { exact_attention_backward(q, k, v, dy, o); }, a_.repeats, a_.min_time);
  backward_record("exact", bh, n, causal, t, exact_backward_flops(problem(bh, n), causal),
                  forward_seconds, false);
  return t.seconds;
}

}  // namespace favor::cli
