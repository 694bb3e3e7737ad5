// favor bench's hybrid section: causal hybrid attention (AttentionOptions::window, ::sinks:
// exact softmax on each query's last w = 64 keys and on the first s = 4, the estimator on
// every other key, one normaliser) against plain FAVOR (window = sinks = 0) and exact
// attention, forward, at each N of --lengths up to 8192; the time per token of the hybrid
// (linear in N), its ratios to both, where it overtakes exact; then the backward of the
// hybrid and of plain FAVOR at one N (2048, or the nearest length below it), recomputing the
// forward and from a saved context (save_causal_states), and the same three rows of the
// bidirectional hybrid (two estimated parts, prefix and suffix) against bidirectional FAVOR;
// then decoding after a prompt of
// kHybridDecodePrompt tokens: HybridDecoder::step (the fused step) and its append + query
// against the plain Decoder::step, one sequence of --bh heads.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "bench_runner.hpp"

namespace favor::cli {
namespace {

using namespace favor::bench;

constexpr int64_t kHybridWindow = 64, kHybridSinks = 4;
constexpr int64_t kHybridLongestN = 8192;  // --lengths above it are left out (exact rows)
constexpr int64_t kHybridBackwardN = 2048;
constexpr int64_t kHybridDecodePrompt = 1024, kHybridDecodeSteps = 64;
constexpr int kHybridDecodeRounds = 7;

// Exact keys of all queries of one head, causal: query i takes its window
// {i - w < j <= i}, min(i + 1, w) keys, and the sinks outside it, min(s, max(0, i + 1 - w));
// bidirectional: {|i - j| < w} and the sinks outside that (src/cpu/band_attention.cpp,
// exact_keys; no mask here).
double hybrid_exact_pairs(int64_t n, int64_t w, int64_t s, bool causal = true) {
  double pairs = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t lo = std::max<int64_t>(0, i - w + 1),
                  hi = causal ? i : std::min(n - 1, i + w - 1);
    pairs += double((hi - lo + 1) + std::min(s, std::max<int64_t>(0, lo)));
  }
  return pairs;
}

// The hybrid's cost model (src/hybrid.cpp). Forward: the exact part, per (query, key) pair
// of the window and sinks s_ij = q_i . k_j (2 D) and the row sums exp(s) [v_j | 1]
// (2 (Dv + 1)): about N (w + s) (2 D + 2 Dv + 2) causal, N (2 w - 1 + s) (...)
// bidirectional; plus each estimated part, causal FAVOR (favor_flops, bench/cost_model.hpp)
// over the rows whose keys reach beyond the window: N - w (the prefix) and, bidirectional,
// N - max(w, 1) more (the suffix, reversed). Backward from a saved context, per exact pair
// the score, dy_i . v_j, dq_i, dk_j and dv_j (2 D + 2 Dv + 2 D + 2 D + 2 Dv) and each part's
// causal FAVOR backward from its chunk states (favor_causal_backward_flops_with_context).
// Recomputing: the forward before it (causal: the forward saving the context, then the
// same); bidirectional, each part's backward reruns its sweep (favor_backward_flops, causal).
// Left out, as exponentials are: the terms linear in N without w or m (the merge of the
// parts' rows, the query norms).
double hybrid_flops(const Problem& p, int64_t w, int64_t s, int64_t chunk, bool backward,
                    bool context = false, bool causal = true) {
  const double pairs = double(p.bh) * hybrid_exact_pairs(p.n, w, s, causal);
  double forward = pairs * (2.0 * p.d + 2.0 * (p.dv + 1));
  double from_context = pairs * (8.0 * p.d + 4.0 * p.dv), rerunning = from_context;
  for (const int64_t offset : {w, causal ? p.n : std::max<int64_t>(w, 1)}) {
    Problem part = p;
    part.n = std::max<int64_t>(0, p.n - offset);
    if (part.n == 0) continue;
    forward += favor_flops(part, true, chunk);
    from_context += favor_causal_backward_flops_with_context(part, chunk);
    rerunning += favor_backward_flops(part, true, chunk);
  }
  if (!backward) return forward;
  if (context) return from_context;
  return forward + (causal ? from_context : rerunning);
}

struct HybridPoint {
  int64_t n;
  double hybrid, favor;
  std::optional<double> exact;
};

// The hybrid's forward (or backward) row at N, causal or bidirectional; its ratio to plain
// FAVOR of the same mask (and exact, where measured) timed just before on the same inputs.
// The backward with `context` from the context a forward saved (its ratio to that forward,
// timed here).
double hybrid_row(BenchRunner& bench, int64_t n, bool backward, double favor_seconds,
                  std::optional<double> exact_seconds, double forward_seconds = 0.0,
                  bool context = false, bool causal = true) {
  const BenchArgs& a = bench.args();
  const int64_t bh = a.bh;
  const auto qkv = bench.inputs(bh, n);
  const Tensor &q = std::get<0>(qkv), &k = std::get<1>(qkv), &v = std::get<2>(qkv);
  const Projection w = Projection::draw(a.m, a.d, {ProjectionKind::orthogonal, NormMode::chi, 0});
  AttentionOptions o;
  o.kernel = bench.kernel();
  o.causal = causal;
  o.window = kHybridWindow;
  o.sinks = kHybridSinks;
  if (data_adapted(o.kernel)) o.fit = fit_kernel(o.kernel, q, k);  // as favor_row
  Measured t;
  double forward = forward_seconds;
  if (backward && context) {  // the forward that saves the context, then the backward from it
    o.save_causal_states = true;
    const Tensor dy = gaussian_rows({1, bh, n, a.d}, 44);
    Tensor out({1, bh, n, a.d}, 0.0f);
    AttentionContext ctx;
    forward = measure([&] { favor_attention(q, k, v, w, out.mutable_view(), o, &ctx); }, a.repeats,
                      a.min_time)
                  .seconds;
    t = measure([&] { favor_attention_backward(q, k, v, dy, w, o, false, &ctx); }, a.repeats,
                a.min_time);
  } else if (backward) {
    const Tensor dy = gaussian_rows({1, bh, n, a.d}, 44);  // as favor_backward_row
    t = measure([&] { favor_attention_backward(q, k, v, dy, w, o); }, a.repeats, a.min_time);
  } else {
    Tensor out({1, bh, n, a.d}, 0.0f);
    t = measure([&] { favor_attention(q, k, v, w, out.mutable_view(), o); }, a.repeats, a.min_time);
  }
  const double flops = hybrid_flops(bench.problem(bh, n), kHybridWindow, kHybridSinks,
                                    kernel_info().causal_chunk, backward, context, causal);
  nlohmann::json r = timed_record("hybrid", causal, n, bh, num_threads(), t, flops);
  r.update({{"pass", backward ? "backward" : "forward"},
            {"window", kHybridWindow},
            {"sinks", kHybridSinks},
            {"ns_per_token", t.seconds / double(n * bh) * 1e9},
            {"ratio_to_favor", t.seconds / favor_seconds},
            {"ratio_to_exact", exact_seconds ? nlohmann::json(t.seconds / *exact_seconds)
                                             : nlohmann::json(nullptr)}});
  if (backward) {
    const double outputs_mb = double(bh * n * (2 * a.d + a.d)) * 4.0 / (1024.0 * 1024.0);
    r.update({{"extra_heap_mb", t.heap_mb - outputs_mb},
              {"context", context},
              {"forward_seconds", forward},
              {"ratio_to_forward", t.seconds / forward}});
  }
  bench.emit(std::move(r));
  if (!a.json) {
    fmt::print(
        "{:>7} hybrid{} / favor = {:.2f}{}{}\n", "", causal ? "" : " (bidirectional)",
        t.seconds / favor_seconds,
        exact_seconds ? fmt::format(", hybrid / exact = {:.3g}", t.seconds / *exact_seconds) : "",
        backward ? fmt::format(", backward{} / forward{} = {:.2f}",
                               context ? " from the context" : " (recomputing)",
                               context ? " saving it" : "", t.seconds / forward)
                 : fmt::format(", {:.1f} ns per token and head", t.seconds / double(n * bh) * 1e9));
  }
  return t.seconds;
}

// The N where the hybrid becomes faster than exact attention: log-log interpolation between
// the last N where it is slower and the next, or a bound when the lengths do not bracket it.
// Recorded on the hybrid's forward rows (exact_crossover, exact_crossover_n).
void hybrid_crossover(BenchRunner& bench, const std::vector<HybridPoint>& points) {
  std::vector<HybridPoint> p;
  for (const HybridPoint& x : points)
    if (x.exact) p.push_back(x);
  if (p.empty()) return;
  std::string kind = "above", text;
  std::optional<double> at;
  if (p.front().hybrid < *p.front().exact) {
    kind = "below";
    text = fmt::format("below N = {} (the hybrid is faster at every N measured)", p.front().n);
  } else {
    text = fmt::format("above N = {} (exact is faster at every N measured)", p.back().n);
  }
  for (size_t i = 1; i < p.size() && kind != "below"; ++i) {
    if (p[i - 1].hybrid >= *p[i - 1].exact && p[i].hybrid < *p[i].exact) {
      const double r0 = std::log(p[i - 1].hybrid / *p[i - 1].exact),
                   r1 = std::log(p[i].hybrid / *p[i].exact);
      const double l0 = std::log(double(p[i - 1].n)), l1 = std::log(double(p[i].n));
      at = std::exp(l0 + (l1 - l0) * r0 / (r0 - r1));
      kind = "interpolated";
      text = fmt::format("N ~ {:.0f} (between {} and {}, log-log interpolation)", *at, p[i - 1].n,
                         p[i].n);
      break;
    }
  }
  for (auto& r : bench.records()) {
    if (r["section"] == "hybrid" && r["method"] == "hybrid" && r["pass"] == "forward") {
      r["exact_crossover"] = kind;
      r["exact_crossover_n"] = at ? nlohmann::json(*at) : nlohmann::json(nullptr);
    }
  }
  if (!bench.args().json) fmt::print("hybrid crossover with exact, forward causal: {}\n", text);
}

// The forward rows again as one table: the three times, the ratios and the hybrid's time
// per token and head (flat in N if it grows linearly).
void hybrid_summary(const BenchRunner& bench, const std::vector<HybridPoint>& points) {
  if (bench.args().json || points.empty()) return;
  fmt::print("hybrid summary (causal forward, w = {}, s = {}, B*H = {}, D = Dv = {}, m = {}):\n",
             kHybridWindow, kHybridSinks, bench.args().bh, bench.args().d, bench.args().m);
  fmt::print("  {:>6} {:>10} {:>10} {:>10} {:>9} {:>9} {:>11}\n", "N", "hybrid s", "favor s",
             "exact s", "hyb/fav", "hyb/ex", "ns/token");
  for (const HybridPoint& x : points) {
    const int64_t bh = bench.args().bh;
    fmt::print("  {:>6} {:>10.4g} {:>10.4g} {:>10} {:>9.2f} {:>9} {:>11.1f}\n", x.n, x.hybrid,
               x.favor, x.exact ? fmt::format("{:.4g}", *x.exact) : "-", x.hybrid / x.favor,
               x.exact ? fmt::format("{:.3g}", x.hybrid / *x.exact) : "-",
               x.hybrid / double(x.n * bh) * 1e9);
  }
}

// [1, H, 1, X] view of token t of a bench input [1, H, T, X].
TensorView token_of(const Tensor& x, int64_t t) {
  const Shape4 s = x.shape();
  return TensorView{
      x.data() + t * s[3], {1, s[1], 1, s[3]}, {s[1] * s[2] * s[3], s[2] * s[3], s[3], 1}};
}

// Decoding after a prompt: the plain Decoder's fused step, the HybridDecoder's fused step
// and its append + query (the two calls a step made before), in kHybridDecodeRounds rounds
// that take each in turn (a median of kHybridDecodeSteps steps each). A row's tokens/s is its
// best round's; its ratio to the plain step the median over rounds of the two in the same
// round (on a shared machine the best rounds of two rows can fall in different moments,
// and their ratio moved by 0.2 between runs). Cost model: decode_step_flops, plus the exact part's
// (w + s) (2 D + 2 (Dv + 1)) per head.
void hybrid_decode_rows(BenchRunner& bench) {
  const BenchArgs& a = bench.args();
  const int64_t heads = a.bh, prompt = kHybridDecodePrompt, steps = kHybridDecodeSteps;
  const Projection w = Projection::draw(a.m, a.d, {ProjectionKind::orthogonal, NormMode::chi, 0});
  DecoderOptions o;
  o.kernel = bench.kernel();
  if (data_adapted(o.kernel)) {
    const auto calibration = bench.inputs(heads, 256, 5000);
    o.fit = fit_kernel(o.kernel, std::get<0>(calibration), std::get<1>(calibration));
  }
  const auto pre = bench.inputs(heads, prompt, 7000);
  const auto tok = bench.inputs(heads, steps, 99);
  auto as_one = [&](const Tensor& x) {  // [1, H, T, X]
    return TensorView{x.data(), {1, heads, x.shape()[2], x.shape()[3]}, x.view().strides};
  };
  Decoder plain(1, heads, a.d, w, o);
  HybridDecoder fused(1, heads, a.d, w, kHybridWindow, kHybridSinks, o);
  HybridDecoder split(1, heads, a.d, w, kHybridWindow, kHybridSinks, o);
  plain.prefill(as_one(std::get<0>(pre)), as_one(std::get<1>(pre)), as_one(std::get<2>(pre)));
  fused.prefill(as_one(std::get<0>(pre)), as_one(std::get<1>(pre)), as_one(std::get<2>(pre)));
  split.prefill(as_one(std::get<0>(pre)), as_one(std::get<1>(pre)), as_one(std::get<2>(pre)));
  const Tensor &q = std::get<0>(tok), &k = std::get<1>(tok), &v = std::get<2>(tok);
  Tensor y({1, heads, 1, a.d});
  int64_t i = 0;
  auto run = [&](auto one) {
    return measure(
        [&] {
          for (int64_t s = 0; s < steps; ++s, ++i) {
            const int64_t t = i % steps;
            one(token_of(q, t), token_of(k, t), token_of(v, t));
          }
        },
        a.repeats, a.min_time);
  };
  Measured best[3] = {{INFINITY, 0, 0}, {INFINITY, 0, 0}, {INFINITY, 0, 0}};
  std::vector<double> round_ratio[3];  // per round: the plain step's median / the row's
  for (int round = 0; round < kHybridDecodeRounds; ++round) {
    const Measured t[3] = {run([&](TensorView qt, TensorView kt, TensorView vt) {
                             plain.step(qt, kt, vt, y.mutable_view());
                           }),
                           run([&](TensorView qt, TensorView kt, TensorView vt) {
                             fused.step(qt, kt, vt, y.mutable_view());
                           }),
                           run([&](TensorView qt, TensorView kt, TensorView vt) {
                             split.append(kt, vt);
                             split.query(qt, y.mutable_view());
                           })};
    for (int r = 0; r < 3; ++r) {
      if (t[r].seconds < best[r].seconds) best[r] = t[r];
      round_ratio[r].push_back(t[0].seconds / t[r].seconds);
    }
  }
  double ratio[3];
  for (int r = 0; r < 3; ++r) {
    std::sort(round_ratio[r].begin(), round_ratio[r].end());
    ratio[r] = round_ratio[r][round_ratio[r].size() / 2];
  }
  const double plain_flops = favor::bench::decode_step_flops(bench.problem(heads, 1));
  const double exact_flops =
      double(heads) * double(kHybridWindow + kHybridSinks) * (2.0 * a.d + 2.0 * (a.d + 1));
  const char* names[3] = {"dec_step", "hyb_step", "hyb_split"};
  for (int r = 0; r < 3; ++r) {
    const double per_step = best[r].seconds / double(steps);
    const double flops = plain_flops + (r > 0 ? exact_flops : 0.0);
    nlohmann::json rec =
        timed_record(names[r], true, prompt, heads, num_threads(), best[r], flops * double(steps));
    rec.update({{"pass", "decode"},
                {"window", r > 0 ? kHybridWindow : 0},
                {"sinks", r > 0 ? kHybridSinks : 0},
                {"seconds", per_step},
                {"tokens_per_s", 1.0 / per_step},
                {"ratio_to_plain_tokens_per_s", ratio[r]}});
    bench.emit(std::move(rec));
  }
  if (!a.json)
    fmt::print(
        "hybrid decode after {} tokens (1 x {} heads): plain step {:.0f} tokens/s, hybrid step "
        "{:.0f} ({:.2f}x plain), hybrid append + query {:.0f} ({:.2f}x)\n",
        prompt, heads, steps / best[0].seconds, steps / best[1].seconds, ratio[1],
        steps / best[2].seconds, ratio[2]);
}

}  // namespace

void section_hybrid(BenchRunner& bench) {
  const BenchArgs& a = bench.args();
  std::vector<int64_t> lengths;
  for (int64_t n : a.lengths)
    if (n <= kHybridLongestN) lengths.push_back(n);
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  if (lengths.empty()) {
    if (!a.json) fmt::print("hybrid: no --lengths at most {}, nothing to run\n", kHybridLongestN);
    return;
  }
  if (!a.json) {
    fmt::print(
        "hybrid: causal (and, at the backward's N, bidirectional), exact softmax on a window of "
        "w = {} keys and s = {} sinks, the {} estimator beyond (m = {}), vs plain FAVOR (w = s = "
        "0) and exact, at N <= {}\n",
        kHybridWindow, kHybridSinks, to_string(bench.kernel()), a.m, kHybridLongestN);
  }
  std::vector<HybridPoint> points;
  for (int64_t n : lengths) {
    const double favor = bench.favor_row(a.bh, n, true, num_threads());
    std::optional<double> exact;
    if (n <= a.max_exact_n) exact = bench.exact_row(a.bh, n, true);
    const double hybrid = hybrid_row(bench, n, false, favor, exact);
    points.push_back({n, hybrid, favor, exact});
  }
  hybrid_crossover(bench, points);
  hybrid_summary(bench, points);
  // The backward at one N: 2048, or the longest length below it, or the shortest.
  const HybridPoint* at = &points.front();
  for (const HybridPoint& x : points)
    if (x.n <= kHybridBackwardN) at = &x;
  const double favor_b = bench.favor_backward_row(a.bh, at->n, true, at->favor, false);
  hybrid_row(bench, at->n, true, favor_b, std::nullopt, at->hybrid);
  hybrid_row(bench, at->n, true, favor_b, std::nullopt, at->hybrid, true);
  // The bidirectional hybrid at the same N: forward and both backwards against bidirectional
  // FAVOR's (two estimated parts, the suffix's view reversed).
  const double favor_bi = bench.favor_row(a.bh, at->n, false, num_threads());
  const double hybrid_bi =
      hybrid_row(bench, at->n, false, favor_bi, std::nullopt, 0.0, false, /*causal=*/false);
  const double favor_bi_b = bench.favor_backward_row(a.bh, at->n, false, favor_bi, false);
  hybrid_row(bench, at->n, true, favor_bi_b, std::nullopt, hybrid_bi, false, false);
  hybrid_row(bench, at->n, true, favor_bi_b, std::nullopt, hybrid_bi, true, false);
  hybrid_decode_rows(bench);
}

}  // namespace favor::cli
