// favor bench: FAVOR and exact attention across lengths, threads and decode positions, with
// GFLOP/s from the cost model (bench/cost_model.hpp) and the same run's large-sgemm rate as
// the machine's yardstick.
#include <cblas.h>
#include <fmt/core.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "alloc_tracker.hpp"
#include "bench_io.hpp"
#ifdef FAVOR_WITH_MPI
#include "bench_distributed.hpp"
#endif
#include "cli_common.hpp"
#include "commands.hpp"
#include "cost_model.hpp"
#include "plot_runner.hpp"
#include "workload.hpp"

namespace favor::cli {
namespace {
using namespace favor::bench;

struct BenchArgs {
  bool json = false;
  std::string out, plot, kernel = "positive";
  std::vector<int64_t> lengths{256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536};
  int64_t bh = 8, d = 64, m = 256, max_exact_n = 32768, scaling_n = 16384, sgemm_n = 4096;
  std::vector<int64_t> decode_positions{1024, 65536};
  std::vector<std::string> sections{"sweep", "long", "scaling", "decode", "backward", "estimators"};
  std::vector<std::string> estimators{"positive", "trig", "hyperbolic", "favorpp", "favorsharp"};
  std::vector<int64_t> estimator_lengths{4096, 16384};
  std::vector<int64_t> backward_lengths{1024, 4096, 16384, 65536};
  int64_t max_exact_backward_n = 4096;
  std::vector<int64_t> vq_lengths{512, 1024, 2048, 4096, 8192, 16384};
  int64_t vq_codes = 256, vq_block = 32;  // favor's default L (cpu::kVQBlock)
  int repeats = 5;
  double min_time = 0.3;
  int64_t distributed_n = 262144, distributed_weak_n = 262144;
  std::vector<int> distributed_ranks{1, 2, 4};
  int64_t io_n = 16384;
  bool has(const std::string& section) const {
    return std::find(sections.begin(), sections.end(), section) != sections.end();
  }
};

// Resident-set figures of this process, in MiB, from /proc/self/status.
double status_mib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0)
      return std::strtod(line.c_str() + std::strlen(field), nullptr) / 1024.0;
  }
  return 0.0;
}

struct Measured {
  double seconds, heap_mb, rss_mb;
};

// The fields every timed row has: what ran, its time, rate (cost-model flops) and memory.
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

// Times f (median) and measures its memory beyond what is live before it: the peak of heap
// bytes it allocates (all favor allocations go through operator new) and the growth of the
// resident high-water mark (reset through /proc/self/clear_refs; BLAS buffers included).
template <class F>
Measured measure(F&& f, int repeats, double min_time) {
  f();  // warm-up: BLAS buffers, page faults of the output
  reset_heap_peak();
  const double rss_before = status_mib("VmRSS:");
  { std::ofstream("/proc/self/clear_refs") << "5"; }
  const double s = median_seconds(f, repeats, 1.0, min_time);
  return {s, double(heap_peak_growth()) / (1024.0 * 1024.0),
          std::max(0.0, status_mib("VmHWM:") - rss_before)};
}

class Bench {
 public:
  explicit Bench(const BenchArgs& a) : a_(a), kernel_(parse_kernel(a.kernel, "--kernel")) {}

  void run() {
    header();
    sgemm();
    section_ = "sweep";
    for (int64_t n : a_.has("sweep") ? a_.lengths : std::vector<int64_t>{}) {
      for (bool causal : {false, true}) {
        favor_row(a_.bh, n, causal, num_threads());
        if (n <= a_.max_exact_n) exact_row(a_.bh, n, causal);
      }
    }
    section_ = "long";
    const int64_t longest = *std::max_element(a_.lengths.begin(), a_.lengths.end());
    for (bool causal : {false, true}) {
      if (a_.has("long")) favor_row(1, longest, causal, num_threads());
    }
    section_ = "scaling";
    if (a_.has("scaling") && num_threads() > 1) {  // the same problems on one thread and on all
      for (int64_t bh : {a_.bh, int64_t{1}}) {
        for (bool causal : {false, true}) {
          favor_row(bh, a_.scaling_n, causal, 1);
          favor_row(bh, a_.scaling_n, causal, num_threads());
        }
      }
    }
    section_ = "backward";
    for (int64_t n : a_.has("backward") ? a_.backward_lengths : std::vector<int64_t>{}) {
      for (bool causal : {false, true}) {
        const double forward = favor_row(a_.bh, n, causal, num_threads());
        favor_backward_row(a_.bh, n, causal, forward);
        if (n <= a_.max_exact_backward_n)
          exact_backward_row(a_.bh, n, causal, exact_row(a_.bh, n, causal));
      }
    }
    section_ = "estimators";
    for (int64_t n : a_.has("estimators") ? a_.estimator_lengths : std::vector<int64_t>{}) {
      for (bool causal : {false, true}) estimator_rows(n, causal);
    }
    section_ = "maps";
    for (int64_t n : a_.has("maps") ? a_.estimator_lengths : std::vector<int64_t>{}) {
      for (bool causal : {false, true}) map_rows(n, causal);
    }
    section_ = "vq";
    if (a_.has("vq")) vq_section();
    section_ = "distributed";
    if (a_.has("distributed")) distributed();
    section_ = "io";
    if (a_.has("io")) io();
    section_ = "decode";
    if (a_.has("decode") && !a_.decode_positions.empty()) {
      decode_row(a_.decode_positions.front(),
                 false);  // warm-up (thread pool, caches): not reported
      for (int64_t pos : a_.decode_positions) decode_row(pos, true);
    }
  }

  const nlohmann::json& records() const { return records_; }

 private:
  // `favor attention` as a whole process vs the same call here (tools/bench_io.cpp).
  void io() {
    IoBenchArgs o;
    o.n = a_.io_n;
    o.bh = a_.bh;
    o.d = a_.d;
    o.m = a_.m;
    o.threads = num_threads();
    o.repeats = std::max(3, a_.repeats);
    o.json = a_.json;
    for (auto& r : io_section(o)) records_.push_back(std::move(r));
  }

  // Sequence-parallel attention over 1, 2, 4 MPI ranks (tools/bench_distributed.cpp).
  void distributed() {
#ifdef FAVOR_WITH_MPI
    DistributedBenchArgs d;
    d.n = a_.distributed_n;
    d.weak_n = a_.distributed_weak_n;
    d.ranks = a_.distributed_ranks;
    d.bh = a_.bh;
    d.d = a_.d;
    d.m = a_.m;
    d.threads = num_threads();
    d.repeats = std::max(1, std::min(a_.repeats, 3));  // the calls take seconds: at most 3
    d.json = a_.json;
    for (auto& r : distributed_section(d)) records_.push_back(std::move(r));
#else
    throw Error(
        "--sections distributed: this favor was built without MPI (install "
        "libopenmpi-dev and rebuild)");
#endif
  }

  Problem problem(int64_t bh, int64_t n, std::optional<Kernel> kernel = {}) const {
    return {bh, n, a_.d, a_.d, a_.m, feature_count(kernel.value_or(kernel_), a_.m)};
  }

  void header() {
    if (a_.json) return;
    fmt::print("favor bench: D = Dv = {}, m = {}, kernel {}; {}\n", a_.d, a_.m, to_string(kernel_),
               build_info());
    fmt::print("{:>7} {:>4} {:>6} {:>6} {:>3} {:>3} {:>11} {:>9} {:>7} {:>12} {:>9} {:>9}\n",
               "method", "pass", "causal", "N", "BH", "thr", "seconds", "GFLOP/s", "%sgemm",
               "tokens/s", "heap MiB", "rss MiB");
  }

  void emit(nlohmann::json r) {
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
    r["percent_of_sgemm"] = rated ? nlohmann::json(pct) : nlohmann::json(nullptr);
    if (!a_.json) {
      fmt::print(
          "{:>7} {:>4} {:>6} {:>6} {:>3} {:>3} {:>11.5f} {:>9} {:>7} {:>12.4g} {:>9.1f} "
          "{:>9.1f}\n",
          r["method"].get<std::string>(),
          r["pass"].get<std::string>() == "backward" ? "bwd" : "fwd",
          r["causal"].get<bool>() ? "yes" : "no", r["n"].get<int64_t>(), r["bh"].get<int64_t>(),
          r["threads"].get<int>(), r["seconds"].get<double>(),
          rated ? fmt::format("{:.1f}", r["gflops"].get<double>()) : "-",
          rated ? fmt::format("{:.0f}%", pct) : "-", r["tokens_per_s"].get<double>(),
          r["peak_heap_mb"].get<double>(), r["rss_growth_mb"].get<double>());
      std::fflush(stdout);
    }
    records_.push_back(std::move(r));
  }

  void sgemm() {
    const int64_t n = a_.sgemm_n;
    std::vector<float> A(n * n, 1.0f), B(n * n, 0.5f), C(n * n, 0.0f);
    const auto fn = [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(n), int(n), int(n), 1.0f, A.data(),
                  int(n), B.data(), int(n), 0.0f, C.data(), int(n));
    };
    openblas_set_num_threads(num_threads());
    const Measured t = measure(fn, a_.repeats, a_.min_time);
    sgemm_gflops_ = sgemm_flops(n) / t.seconds / 1e9;
    emit({{"method", "sgemm"},
          {"causal", false},
          {"n", n},
          {"bh", 1},
          {"threads", num_threads()},
          {"seconds", t.seconds},
          {"gflops", sgemm_gflops_},
          {"tokens_per_s", 0.0},
          {"peak_heap_mb", t.heap_mb},
          {"rss_growth_mb", t.rss_mb}});
  }

  // One FAVOR forward row. kernel: the --kernel one unless given (the estimators section).
  // Bidirectional FAVOR++ / FAVOR# fit themselves inside the timed call; causal ones are
  // given a fit made beforehand (from calibration data in real use), not timed here.
  double favor_row(int64_t bh, int64_t n, bool causal, int threads,
                   std::optional<Kernel> kernel = {}, nlohmann::json extra = {}) {
    const auto qkv = inputs(bh, n);  // not bound by [q, k, v]: clang 14 cannot capture bindings
    const Tensor &q = std::get<0>(qkv), &k = std::get<1>(qkv), &v = std::get<2>(qkv);
    const Projection w =
        Projection::draw(a_.m, a_.d, {ProjectionKind::orthogonal, NormMode::chi, 0});
    Tensor out({1, bh, n, a_.d}, 0.0f);
    AttentionOptions o;
    o.kernel = kernel.value_or(kernel_);
    o.causal = causal;
    if (causal && data_adapted(o.kernel)) o.fit = fit_kernel(o.kernel, q, k);
    const int saved = num_threads();
    set_num_threads(threads);
    const Measured t = measure([&] { favor_attention(q, k, v, w, out.mutable_view(), o); },
                               a_.repeats, a_.min_time);
    set_num_threads(saved);
    const double flops = favor_flops(problem(bh, n, o.kernel), causal, kernel_info().causal_chunk);
    nlohmann::json r = timed_record("favor", causal, n, bh, threads, t, flops);
    if (kernel) r["kernel"] = to_string(*kernel);
    if (extra.is_object()) r.update(extra);
    emit(std::move(r));
    return t.seconds;
  }

  // Every estimator at one N, timed against FAVOR+ (positive) measured just before it in
  // the same run: ratio_to_positive = seconds / seconds(positive). GFLOP/s counts the
  // cost model's flops for the estimator's F (2m for trig and hyperbolic).
  void estimator_rows(int64_t n, bool causal) {
    const double base =
        favor_row(a_.bh, n, causal, num_threads(), Kernel::positive, {{"ratio_to_positive", 1.0}});
    for (const std::string& name : a_.estimators) {
      const Kernel kernel = parse_kernel(name, "--estimators");
      if (kernel == Kernel::positive) continue;
      const double seconds = favor_row(a_.bh, n, causal, num_threads(), kernel);
      records_.back()["ratio_to_positive"] = seconds / base;
      if (!a_.json) fmt::print("{:>7} {} / positive = {:.2f}\n", "", name, seconds / base);
    }
  }

  // The cost of the DiJiang and learned maps (feature_map.hpp) at one N, against FAVOR+
  // (positive, shared W) timed just before, forward and backward (with the parameter
  // gradients): feature weights lambda, per-head learned W, b and lambda, Hedgehog (m / 2
  // projections: the same F) and, causal, the decay. ratio_to_positive = seconds / FAVOR+'s.
  void map_rows(int64_t n, bool causal) {
    const auto qkv = inputs(a_.bh, n);  // not bound by [q, k, v]: clang 14 cannot capture bindings
    const Tensor &q = std::get<0>(qkv), &k = std::get<1>(qkv), &v = std::get<2>(qkv);
    const Tensor dy = gaussian_rows({1, a_.bh, n, a_.d}, 44);
    const int64_t heads = a_.bh, m = a_.m;
    auto draw = [&](int64_t rows) {
      return Projection::draw(rows, a_.d, {ProjectionKind::orthogonal, NormMode::chi, 0});
    };
    std::vector<std::pair<std::string, FeatureMap>> maps;
    maps.emplace_back("positive", FeatureMap(draw(m)));
    maps.emplace_back("lambda", FeatureMap(draw(m)));
    maps.back().second.learnable(heads, false, false, true);
    maps.emplace_back("learned", FeatureMap(draw(m)));
    maps.back().second.learnable(heads);
    maps.emplace_back("hedgehog", FeatureMap(draw(std::max<int64_t>(m / 2, 1)), Kernel::hedgehog));
    maps.back().second.learnable(heads, true, true, false);
    if (causal) maps.emplace_back("decay", FeatureMap(draw(m)));
    double base_fwd = 0.0, base_bwd = 0.0;
    for (const auto& named : maps) {
      const std::string& name = named.first;
      const FeatureMap& map = named.second;  // captured below: not a binding (clang 14)
      AttentionOptions o;
      o.causal = causal;
      if (name == "decay") o.decay.assign(static_cast<size_t>(heads), 0.99);
      Tensor out({1, a_.bh, n, a_.d});
      const Measured f = measure([&] { favor_attention(q, k, v, map, out.mutable_view(), o); },
                                 a_.repeats, a_.min_time);
      const bool grads = name != "positive";
      const Measured b = measure([&] { favor_attention_backward(q, k, v, dy, map, o, grads); },
                                 a_.repeats, a_.min_time);
      if (name == "positive") {
        base_fwd = f.seconds;
        base_bwd = b.seconds;
      }
      const Problem prob{a_.bh, n, a_.d, a_.d, map.m(), map.features()};
      const int64_t chunk = kernel_info().causal_chunk;
      nlohmann::json rf = timed_record("favor", causal, n, a_.bh, num_threads(), f,
                                       favor_flops(prob, causal, chunk));
      rf.update({{"map", name}, {"pass", "forward"}, {"ratio_to_positive", f.seconds / base_fwd}});
      emit(std::move(rf));
      nlohmann::json rb = timed_record("favor", causal, n, a_.bh, num_threads(), b,
                                       favor_backward_flops(prob, causal, chunk));
      rb.update({{"map", name},
                 {"pass", "backward"},
                 {"parameter_grads", grads},
                 {"ratio_to_positive", b.seconds / base_bwd}});
      emit(std::move(rb));
      if (!a_.json) {
        fmt::print("{:>7} {} / positive = {:.2f} forward, {:.2f} backward\n", "", name,
                   f.seconds / base_fwd, b.seconds / base_bwd);
      }
    }
  }

  double exact_row(int64_t bh, int64_t n, bool causal) {
    const auto qkv = inputs(bh, n);  // not bound by [q, k, v]: clang 14 cannot capture bindings
    const Tensor &q = std::get<0>(qkv), &k = std::get<1>(qkv), &v = std::get<2>(qkv);
    Tensor out({1, bh, n, a_.d}, 0.0f);
    ExactOptions o;
    o.causal = causal;
    const Measured t =
        measure([&] { exact_attention(q, k, v, out.mutable_view(), o); }, a_.repeats, a_.min_time);
    emit(timed_record("exact", causal, n, bh, num_threads(), t,
                      exact_flops(problem(bh, n), causal)));
    return t.seconds;
  }

  // Backward rows: the gradients dq, dk, dv are returned (allocated by the call), so the
  // heap figure includes them; `extra_heap_mb` is the heap beyond those outputs.
  // `ratio_to_forward` divides by the forward time measured just before.
  void backward_record(const char* method, int64_t bh, int64_t n, bool causal, const Measured& t,
                       double flops, double forward_seconds, bool context) {
    const double outputs_mb = double(bh * n * (2 * a_.d + a_.d)) * 4.0 / (1024.0 * 1024.0);
    nlohmann::json r = timed_record(method, causal, n, bh, num_threads(), t, flops);
    r.update({{"pass", "backward"},
              {"extra_heap_mb", t.heap_mb - outputs_mb},
              {"context", context},
              {"ratio_to_forward", t.seconds / forward_seconds}});
    emit(std::move(r));
  }

  // FAVOR backward. Bidirectional: also the training pattern, a forward that saves its
  // key state (AttentionContext) and a backward that uses it; its ratio is to that forward.
  double favor_backward_row(int64_t bh, int64_t n, bool causal, double forward_seconds,
                            bool with_context = true) {
    const auto qkv = inputs(bh, n);  // not bound by [q, k, v]: clang 14 cannot capture bindings
    const Tensor &q = std::get<0>(qkv), &k = std::get<1>(qkv), &v = std::get<2>(qkv);
    const Tensor dy = gaussian_rows({1, bh, n, a_.d}, 44);
    const Projection w =
        Projection::draw(a_.m, a_.d, {ProjectionKind::orthogonal, NormMode::chi, 0});
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
    if (!causal && with_context) {
      Tensor out({1, bh, n, a_.d});
      AttentionContext ctx;
      const Measured f = measure([&] { favor_attention(q, k, v, w, out.mutable_view(), o, &ctx); },
                                 a_.repeats, a_.min_time);
      const Measured b = measure([&] { favor_attention_backward(q, k, v, dy, w, o, false, &ctx); },
                                 a_.repeats, a_.min_time);
      backward_record("favor", bh, n, causal, b, favor_backward_flops_with_context(prob), f.seconds,
                      true);
    }
    return t.seconds;
  }

  double exact_backward_row(int64_t bh, int64_t n, bool causal, double forward_seconds) {
    const auto qkv = inputs(bh, n);  // not bound by [q, k, v]: clang 14 cannot capture bindings
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

  // Decode: prefill `position` tokens, then time steps of append(k, v) + query(q) for all
  // heads at once. tokens/s counts steps (one token per sequence).
  void decode_row(int64_t position, bool report) {
    const int64_t bh = a_.bh, steps = 256;
    const Projection w =
        Projection::draw(a_.m, a_.d, {ProjectionKind::orthogonal, NormMode::chi, 0});
    DecoderOptions options;
    options.kernel = kernel_;
    if (data_adapted(kernel_)) {  // a fit from calibration rows (the decoder needs one)
      const auto [cq, ck, cv] = inputs(bh, 256, 5000);
      options.fit = fit_kernel(kernel_, cq, ck);
    }
    Decoder dec(1, bh, a_.d, w, options);
    const int64_t chunk = 4096;
    for (int64_t done = 0; done < position; done += chunk) {
      const int64_t t = std::min(chunk, position - done);
      const auto [q, k, v] = inputs(bh, t, 7000 + done);
      dec.append(k, v);
    }
    const auto qkv =
        inputs(bh, steps, 99);  // not bound by [q, k, v]: clang 14 cannot capture bindings
    const Tensor &q = std::get<0>(qkv), &k = std::get<1>(qkv), &v = std::get<2>(qkv);
    Tensor y({1, bh, 1, a_.d});
    int64_t i = 0;
    const auto step = [&] {
      const auto slice = [&](const Tensor& t) {
        return TensorView{
            t.data() + (i % steps) * a_.d, {1, bh, 1, a_.d}, contiguous_strides(t.shape())};
      };
      dec.append(slice(k), slice(v));
      dec.query(slice(q), y.mutable_view());
      ++i;
    };
    const Measured t = measure(
        [&] {
          for (int64_t s = 0; s < steps; ++s) step();
        },
        a_.repeats, a_.min_time);
    const double per_step = t.seconds / double(steps);
    if (!report) return;
    emit({{"method", "decode"},
          {"causal", true},
          {"n", position},
          {"bh", bh},
          {"threads", num_threads()},
          {"seconds", per_step},
          {"gflops", decode_step_flops(problem(bh, 1)) / per_step / 1e9},
          {"tokens_per_s", 1.0 / per_step},
          {"peak_heap_mb", t.heap_mb},
          {"rss_growth_mb", t.rss_mb}});
  }

  // The vq section: VQ, FAVOR+ and exact attention at each N, forward and backward, in one
  // run; then where VQ overtakes exact attention.
  void vq_section() {
    std::vector<int64_t> lengths = a_.vq_lengths;
    if (std::find(lengths.begin(), lengths.end(), kSeed002N) == lengths.end())
      lengths.push_back(kSeed002N);  // seed 002's setting is always measured
    std::sort(lengths.begin(), lengths.end());
    lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
    if (!a_.json) {
      fmt::print(
          "vq: hard VQ with c = {} codes (the keys at rows j N / c of each head: random keys, "
          "as the keys are iid; no k-means), causal block L = {}, vs FAVOR+ with m = {} and "
          "exact\n",
          a_.vq_codes, a_.vq_block, a_.m);
    }
    std::map<std::pair<bool, bool>, std::vector<CrossPoint>> series;  // (backward, causal)
    for (int64_t n : lengths) {
      tag_ = {{"codes", a_.vq_codes},
              {"seed002_setting",
               n == kSeed002N && a_.bh == 8 && a_.d == 64 && a_.vq_codes == 256 && a_.m == 256}};
      for (bool causal : {false, true}) {
        const double favor = favor_row(a_.bh, n, causal, num_threads());
        std::optional<double> exact;
        if (n <= a_.max_exact_n) exact = exact_row(a_.bh, n, causal);
        const double vq = vq_row(n, causal, false, favor, exact);
        if (exact) series[{false, causal}].push_back({n, vq, *exact});
        const double favor_b = favor_backward_row(a_.bh, n, causal, favor, false);
        std::optional<double> exact_b;
        if (exact && n <= a_.max_exact_backward_n)
          exact_b = exact_backward_row(a_.bh, n, causal, *exact);
        const double vq_b = vq_row(n, causal, true, favor_b, exact_b);
        if (exact_b) series[{true, causal}].push_back({n, vq_b, *exact_b});
      }
    }
    tag_ = nullptr;
    for (const auto& [key, points] : series) crossover(key.first, key.second, points);
    seed002_summary();
  }

  // Seed 002's setting on lines of its own: the section's rows at N = 4096.
  void seed002_summary() const {
    if (a_.json) return;
    const bool exact_setting = a_.bh == 8 && a_.d == 64 && a_.vq_codes == 256 && a_.m == 256;
    fmt::print(
        "seed 002's setting, N = {}, B*H = {}, D = Dv = {}, c = {}, m = {}{}:\n", kSeed002N, a_.bh,
        a_.d, a_.vq_codes, a_.m,
        exact_setting ? "" : " (this run's sizes, not seed 002's 8 heads of 64, c = m = 256)");
    for (const char* pass : {"forward", "backward"})
      for (bool causal : {false, true}) {
        std::map<std::string, double> s;
        for (const auto& r : records_) {
          if (r["section"] == "vq" && r["n"] == kSeed002N && r["pass"] == pass &&
              r["causal"] == causal && !r.value("context", false))
            s[r["method"].get<std::string>()] = r["seconds"].get<double>();
        }
        std::string exact = "exact not run";
        if (s.count("exact"))
          exact =
              fmt::format("exact {:.4g} s (vq / exact {:.3g})", s["exact"], s["vq"] / s["exact"]);
        fmt::print("  {:<8} {:<13} vq {:.4g} s, favor+ {:.4g} s (vq / favor+ {:.2f}), {}\n", pass,
                   causal ? "causal" : "bidirectional", s["vq"], s["favor"], s["vq"] / s["favor"],
                   exact);
      }
  }

  // Hard VQ forward or backward at N with a codebook of a_.vq_codes keys of each head; its
  // ratios to FAVOR+ and (where measured) exact attention timed just before.
  double vq_row(int64_t n, bool causal, bool backward, double favor_seconds,
                std::optional<double> exact_seconds) {
    const int64_t bh = a_.bh, c = a_.vq_codes;
    const auto qkv = inputs(bh, n);  // not bound by [q, k, v]: clang 14 cannot capture bindings
    const Tensor &q = std::get<0>(qkv), &k = std::get<1>(qkv), &v = std::get<2>(qkv);
    Tensor codebook({1, bh, c, a_.d});
    for (int64_t h = 0; h < bh; ++h)
      for (int64_t s = 0; s < c; ++s)
        for (int64_t x = 0; x < a_.d; ++x) codebook.at(0, h, s, x) = k.at(0, h, s * n / c, x);
    VQOptions o;
    o.causal = causal;
    o.block = a_.vq_block;
    Measured t;
    if (backward) {
      const Tensor dy = gaussian_rows({1, bh, n, a_.d}, 44);
      t = measure([&] { vq_attention_backward(q, k, v, dy, codebook, o); }, a_.repeats,
                  a_.min_time);
    } else {
      Tensor out({1, bh, n, a_.d});
      t = measure([&] { vq_attention(q, k, v, codebook, out.mutable_view(), o); }, a_.repeats,
                  a_.min_time);
    }
    const double flops = backward ? vq_backward_flops(problem(bh, n), c, causal, a_.vq_block)
                                  : vq_flops(problem(bh, n), c, causal, a_.vq_block);
    nlohmann::json r = timed_record("vq", causal, n, bh, num_threads(), t, flops);
    r.update({{"pass", backward ? "backward" : "forward"},
              {"block", a_.vq_block},
              {"codebook", "keys"},
              {"ratio_to_favor", t.seconds / favor_seconds},
              {"ratio_to_exact", exact_seconds ? nlohmann::json(t.seconds / *exact_seconds)
                                               : nlohmann::json(nullptr)}});
    emit(std::move(r));
    if (!a_.json) {
      fmt::print(
          "{:>7} vq / favor+ = {:.2f}{}\n", "", t.seconds / favor_seconds,
          exact_seconds ? fmt::format(", vq / exact = {:.3g}", t.seconds / *exact_seconds) : "");
    }
    return t.seconds;
  }

  struct CrossPoint {
    int64_t n;
    double vq, exact;
  };

  // The N where VQ becomes faster than exact attention: interpolated log-log between the
  // last N where VQ is slower and the next, or only bounded when the sweep does not bracket
  // it. Recorded on the series' VQ rows (exact_crossover_n, exact_crossover).
  void crossover(bool backward, bool causal, const std::vector<CrossPoint>& p) {
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
        const double r0 = std::log(p[i - 1].vq / p[i - 1].exact),
                     r1 = std::log(p[i].vq / p[i].exact);
        const double l0 = std::log(double(p[i - 1].n)), l1 = std::log(double(p[i].n));
        at = std::exp(l0 + (l1 - l0) * r0 / (r0 - r1));
        kind = "interpolated";
        text = fmt::format("N ~ {:.0f} (between {} and {}, log-log interpolation)", *at, p[i - 1].n,
                           p[i].n);
        break;
      }
    }
    for (auto& r : records_) {
      if (r["section"] == "vq" && r["method"] == "vq" && r["causal"] == causal &&
          (r["pass"] == "backward") == backward) {
        r["exact_crossover"] = kind;
        r["exact_crossover_n"] = at ? nlohmann::json(*at) : nlohmann::json(nullptr);
      }
    }
    if (!a_.json) {
      fmt::print("vq crossover with exact, {} {}: {}\n", backward ? "backward" : "forward",
                 causal ? "causal" : "bidirectional", text);
    }
  }

  std::tuple<Tensor, Tensor, Tensor> inputs(int64_t bh, int64_t n, uint64_t seed = 0) const {
    const double norm = std::pow(double(a_.d), 0.25);
    return {gaussian_rows({1, bh, n, a_.d}, 11 + seed, norm),
            gaussian_rows({1, bh, n, a_.d}, 22 + seed, norm),
            gaussian_rows({1, bh, n, a_.d}, 33 + seed)};
  }

  static constexpr int64_t kSeed002N = 4096;  // seed 002: N = 4096, 8 heads of 64, c = 256

  BenchArgs a_;
  Kernel kernel_;
  nlohmann::json tag_;  // fields added to every record emitted while set
  std::string section_ = "yardstick";
  double sgemm_gflops_ = 0.0;
  nlohmann::json records_ = nlohmann::json::array();
};

void run(const BenchArgs& a) {
  for (int64_t n : a.lengths) {
    if (n < 1) throw Error("--lengths: " + std::to_string(n) + " must be >= 1");
  }
  if (a.lengths.empty()) throw Error("--lengths: at least one length");
  if (a.bh < 1 || a.d < 1 || a.m < 1 || a.repeats < 1 || a.sgemm_n < 1 || a.scaling_n < 1) {
    throw Error("--bh, --dim, --features, --repeats, --sgemm-n, --scaling-n: must be >= 1");
  }
  if (!(a.min_time >= 0.0)) throw Error("--min-time: must be >= 0");
  for (const std::string& e : a.estimators) parse_kernel(e, "--estimators");
  for (int64_t n : a.estimator_lengths) {
    if (n < 1) throw Error("--estimator-lengths: " + std::to_string(n) + " must be >= 1");
  }
  if (a.vq_lengths.empty()) throw Error("--vq-lengths: at least one length");
  for (int64_t n : a.vq_lengths) {
    if (n < 1) throw Error("--vq-lengths: " + std::to_string(n) + " must be >= 1");
  }
  if (a.vq_block < 1) throw Error("--vq-block: " + std::to_string(a.vq_block) + " must be >= 1");
  const int64_t shortest =
      std::min(*std::min_element(a.vq_lengths.begin(), a.vq_lengths.end()), int64_t{4096});
  if (a.vq_codes < 1 || a.vq_codes > shortest) {
    throw Error("--vq-codes: " + std::to_string(a.vq_codes) + " must be in [1, " +
                std::to_string(shortest) +
                "]: the codes are keys of each head at the shortest --vq-lengths (and 4096)");
  }
  for (int p : a.distributed_ranks) {
    if (p < 1) throw Error("--distributed-ranks: " + std::to_string(p) + " must be >= 1");
  }
  if (a.distributed_n < 1 || a.distributed_weak_n < 1)
    throw Error("--distributed-n, --distributed-weak-n: must be >= 1");
  for (int64_t pos : a.decode_positions) {
    if (pos < 0) throw Error("--decode-positions: " + std::to_string(pos) + " must be >= 0");
  }
  Bench bench(a);
  bench.run();
  const std::string text = bench.records().dump(2) + "\n";
  if (a.json) fmt::print("{}", text);
  StagedOutputs outputs;
  if (!a.out.empty()) outputs.stage(a.out, text, "--out");
  if (!a.plot.empty()) {
    // The plot is drawn by matplotlib into a staged file, moved into place with --out.
    draw_plot(
        find_plot_script("FAVOR_PLOT_SCRIPT",
                         {FAVOR_PLOT_SCRIPT_INSTALLED, FAVOR_PLOT_SCRIPT_SOURCE}, "plot_bench.py"),
        text, a.plot, outputs);
  }
  outputs.commit();
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Benchmark FAVOR and exact attention, decode and the BLAS yardstick");
  cmd->add_flag("--json", a->json, "print the records as a JSON array instead of the table");
  cmd->add_option("--out", a->out, "also write the JSON records to this file");
  cmd->add_option("--plot", a->plot,
                  "draw time vs N (log-log), favor vs exact, into this PNG (matplotlib)");
  cmd->add_option("--lengths", a->lengths, "sequence lengths of the sweep")->capture_default_str();
  cmd->add_option("--bh", a->bh, "batch x heads of the sweep")->capture_default_str();
  cmd->add_option("--dim", a->d, "head dim D = Dv")->capture_default_str();
  cmd->add_option("--features", a->m, "projections m")->capture_default_str();
  cmd->add_option("--kernel", a->kernel,
                  "positive | trig | hyperbolic | favorpp | favorsharp (all rows but "
                  "the estimators section)")
      ->capture_default_str();
  cmd->add_option("--estimator,--estimators", a->estimators,
                  "kernels of the estimators section, each timed against positive (FAVOR+)")
      ->capture_default_str();
  cmd->add_option("--estimator-lengths", a->estimator_lengths,
                  "N of the estimators and maps sections")
      ->capture_default_str();
  cmd->add_option("--max-exact-n", a->max_exact_n, "longest N for exact attention")
      ->capture_default_str();
  cmd->add_option("--scaling-n", a->scaling_n, "N of the one-thread vs all-threads rows")
      ->capture_default_str();
  cmd->add_option("--decode-positions", a->decode_positions, "decode positions to time")
      ->capture_default_str();
  cmd->add_option("--sgemm-n", a->sgemm_n, "size of the yardstick sgemm")->capture_default_str();
  cmd->add_option("--sections", a->sections,
                  "which rows: sweep (N x causal, favor and exact), long (B*H = 1 at the "
                  "longest N), scaling (1 thread vs all), decode, backward, estimators "
                  "(each --estimators kernel vs positive), maps (feature weights, learned and "
                  "Hedgehog maps, decay vs FAVOR+) and vq (Transformer-VQ vs FAVOR+ and exact, "
                  "forward and backward) and distributed (sequence-parallel attention over "
                  "mpirun's ranks: strong and weak scaling) and io (favor attention as a whole "
                  "process on .npy files vs the same call in process); maps, vq, distributed "
                  "and io are not in the default run")
      ->capture_default_str()
      ->check(CLI::IsMember({"sweep", "long", "scaling", "decode", "backward", "estimators", "maps",
                             "vq", "distributed", "io"}));
  cmd->add_option("--distributed-n", a->distributed_n,
                  "N of the distributed section's strong scaling (one sequence over P ranks)")
      ->capture_default_str();
  cmd->add_option("--distributed-weak-n", a->distributed_weak_n,
                  "tokens per rank of the distributed section's weak scaling")
      ->capture_default_str();
  cmd->add_option("--distributed-ranks", a->distributed_ranks,
                  "rank counts P of the distributed section (mpirun -np P)")
      ->capture_default_str();
  cmd->add_option("--io-n", a->io_n, "N of the io section (inputs [1, bh, N, dim])")
      ->capture_default_str();
  cmd->add_option("--vq-lengths", a->vq_lengths,
                  "N of the vq section (N = 4096, seed 002's setting, is always added)")
      ->capture_default_str();
  cmd->add_option("--vq-codes", a->vq_codes, "codes c of the vq section")->capture_default_str();
  cmd->add_option("--vq-block", a->vq_block, "causal block length L of the vq section")
      ->capture_default_str();
  cmd->add_option("--backward-lengths", a->backward_lengths, "N of the backward rows")
      ->capture_default_str();
  cmd->add_option("--max-exact-backward-n", a->max_exact_backward_n, "longest N for exact backward")
      ->capture_default_str();
  cmd->add_option("--min-time", a->min_time,
                  "seconds of timed runs per row at least (short rows repeat)")
      ->capture_default_str();
  cmd->add_option("--repeats", a->repeats,
                  "timed repeats per row (median); runs over 1 s are timed once")
      ->capture_default_str();
  cmd->callback([a] { run(*a); });
#ifdef FAVOR_WITH_MPI
  add_distributed_bench_rank_command(app);  // the hidden command each rank runs
#endif
}

}  // namespace favor::cli
