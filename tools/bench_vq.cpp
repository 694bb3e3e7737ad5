// favor bench's vq section: hard Transformer-VQ, FAVOR+ and exact attention at each
// --vq-lengths N, forward and backward, in one run; then where VQ overtakes exact attention,
// and seed 002's setting (N = 4096) on lines of its own.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bench_runner.hpp"

namespace favor::cli {
namespace {

using namespace favor::bench;

constexpr int64_t kSeed002N = 4096;  // seed 002: N = 4096, 8 heads of 64, c = 256

struct CrossPoint {
  int64_t n;
  double vq, exact;
};

// Hard VQ forward or backward at N with a codebook of --vq-codes keys of each head; its
// ratios to FAVOR+ and (where measured) exact attention timed just before.
double vq_row(BenchRunner& bench, int64_t n, bool causal, bool backward, double favor_seconds,
              std::optional<double> exact_seconds) {
  const BenchArgs& a = bench.args();
  const int64_t bh = a.bh, c = a.vq_codes;
  const auto qkv = bench.inputs(bh, n);
  const Tensor &q = std::get<0>(qkv), &k = std::get<1>(qkv), &v = std::get<2>(qkv);
  Tensor codebook({1, bh, c, a.d});
  for (int64_t h = 0; h < bh; ++h)
    for (int64_t s = 0; s < c; ++s)
      for (int64_t x = 0; x < a.d; ++x) codebook.at(0, h, s, x) = k.at(0, h, s * n / c, x);
  VQOptions o;
  o.causal = causal;
  o.block = a.vq_block;
  Measured t;
  if (backward) {
    const Tensor dy = gaussian_rows({1, bh, n, a.d}, 44);
    t = measure([&] { vq_attention_backward(q, k, v, dy, codebook, o); }, a.repeats, a.min_time);
  } else {
    Tensor out({1, bh, n, a.d});
    t = measure([&] { vq_attention(q, k, v, codebook, out.mutable_view(), o); }, a.repeats,
                a.min_time);
  }
  const double flops = backward ? vq_backward_flops(bench.problem(bh, n), c, causal, a.vq_block)
                                : vq_flops(bench.problem(bh, n), c, causal, a.vq_block);
  nlohmann::json r = timed_record("vq", causal, n, bh, num_threads(), t, flops);
  r.update({{"pass", backward ? "backward" : "forward"},
            {"block", a.vq_block},
            {"codebook", "keys"},
            {"ratio_to_favor", t.seconds / favor_seconds},
            {"ratio_to_exact", exact_seconds ? nlohmann::json(t.seconds / *exact_seconds)
                                             : nlohmann::json(nullptr)}});
  bench.emit(std::move(r));
  if (!a.json) {
    fmt::print(
        "{:>7} vq / favor+ = {:.2f}{}\n", "", t.seconds / favor_seconds,
        exact_seconds ? fmt::format(", vq / exact = {:.3g}", t.seconds / *exact_seconds) : "");
  }
  return t.seconds;
}

// The N where VQ becomes faster than exact attention: interpolated log-log between the last N
// where VQ is slower and the next, or only bounded when the sweep does not bracket it.
// Recorded on the series' VQ rows (exact_crossover_n, exact_crossover).
void crossover(BenchRunner& bench, bool backward, bool causal, const std::vector<CrossPoint>& p) {
  std::string kind = "above", text;
  std::optional<double> at;
  if (p.front().vq < p.front().exact) {
    kind = "below";
    text = fmt::format("below N = {} (VQ is faster at every N measured)", p.front().n);
  } else {
    text = fmt::format("above N = {} (exact is faster at every N measured)", p.back().n);
  }
  for (size_t i = 1; i < p.size() && kind != "below"; ++i) {
    if (p[i - 1].vq >= p[i - 1].exact && p[i].vq < p[i].exact) {
      const double r0 = std::log(p[i - 1].vq / p[i - 1].exact), r1 = std::log(p[i].vq / p[i].exact);
      const double l0 = std::log(double(p[i - 1].n)), l1 = std::log(double(p[i].n));
      at = std::exp(l0 + (l1 - l0) * r0 / (r0 - r1));
      kind = "interpolated";
      text = fmt::format("N ~ {:.0f} (between {} and {}, log-log interpolation)", *at, p[i - 1].n,
                         p[i].n);
      break;
    }
  }
  for (auto& r : bench.records()) {
    if (r["section"] == "vq" && r["method"] == "vq" && r["causal"] == causal &&
        (r["pass"] == "backward") == backward) {
      r["exact_crossover"] = kind;
      r["exact_crossover_n"] = at ? nlohmann::json(*at) : nlohmann::json(nullptr);
    }
  }
  if (!bench.args().json) {
    fmt::print("vq crossover with exact, {} {}: {}\n", backward ? "backward" : "forward",
               causal ? "causal" : "bidirectional", text);
  }
}

// Seed 002's setting on lines of its own: the section's rows at N = 4096.
void seed002_summary(const BenchRunner& bench) {
  const BenchArgs& a = bench.args();
  if (a.json) return;
  const bool exact_setting = a.bh == 8 && a.d == 64 && a.vq_codes == 256 && a.m == 256;
  fmt::print("seed 002's setting, N = {}, B*H = {}, D = Dv = {}, c = {}, m = {}{}:\n", kSeed002N,
             a.bh, a.d, a.vq_codes, a.m,
             exact_setting ? "" : " (this run's sizes, not seed 002's 8 heads of 64, c = m = 256)");
  for (const char* pass : {"forward", "backward"})
    for (bool causal : {false, true}) {
      std::map<std::string, double> s;
      for (const auto& r : bench.records()) {
        if (r["section"] == "vq" && r["n"] == kSeed002N && r["pass"] == pass &&
            r["causal"] == causal && !r.value("context", false))
          s[r["method"].get<std::string>()] = r["seconds"].get<double>();
      }
      std::string exact = "exact not run";
      if (s.count("exact"))
        exact = fmt::format("exact {:.4g} s (vq / exact {:.3g})", s["exact"], s["vq"] / s["exact"]);
      fmt::print("  {:<8} {:<13} vq {:.4g} s, favor+ {:.4g} s (vq / favor+ {:.2f}), {}\n", pass,
                 causal ? "causal" : "bidirectional", s["vq"], s["favor"], s["vq"] / s["favor"],
                 exact);
    }
}

}  // namespace

void section_vq(BenchRunner& bench) {
  const BenchArgs& a = bench.args();
  std::vector<int64_t> lengths = a.vq_lengths;
  if (std::find(lengths.begin(), lengths.end(), kSeed002N) == lengths.end())
    lengths.push_back(kSeed002N);  // seed 002's setting is always measured
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  if (!a.json) {
    fmt::print(
        "vq: hard VQ with c = {} codes (the keys at rows j N / c of each head: random keys, "
        "as the keys are iid; no k-means), causal block L = {}, vs FAVOR+ with m = {} and "
        "exact\n",
        a.vq_codes, a.vq_block, a.m);
  }
  std::map<std::pair<bool, bool>, std::vector<CrossPoint>> series;  // (backward, causal)
  for (int64_t n : lengths) {
    bench.set_tag({{"codes", a.vq_codes},
                   {"seed002_setting",
                    n == kSeed002N && a.bh == 8 && a.d == 64 && a.vq_codes == 256 && a.m == 256}});
    for (bool causal : {false, true}) {
      const double favor = bench.favor_row(a.bh, n, causal, num_threads());
      std::optional<double> exact;
      if (n <= a.max_exact_n) exact = bench.exact_row(a.bh, n, causal);
      const double vq = vq_row(bench, n, causal, false, favor, exact);
      if (exact) series[{false, causal}].push_back({n, vq, *exact});
      const double favor_b = bench.favor_backward_row(a.bh, n, causal, favor, false);
      std::optional<double> exact_b;
      if (exact && n <= a.max_exact_backward_n)
        exact_b = bench.exact_backward_row(a.bh, n, causal, *exact);
      const double vq_b = vq_row(bench, n, causal, true, favor_b, exact_b);
      if (exact_b) series[{true, causal}].push_back({n, vq_b, *exact_b});
    }
  }
  bench.set_tag(nullptr);
  for (const auto& [key, points] : series) crossover(bench, key.first, key.second, points);
  seed002_summary(bench);
}

}  // namespace favor::cli
