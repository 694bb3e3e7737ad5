// favor bench's bf16 section: bidirectional FAVOR+ forward in fp32 and with bf16 GEMMs
// (AttentionOptions::precision) at N = 4096 and 16384 (--bf16-lengths), the same problems
// in the same run, with the speed ratio and the accuracy each costs: on head 0's first 1024
// queries (all keys), the relative error of fp32 FAVOR against exact attention (the
// estimator's own error) and of bf16 FAVOR against fp32 FAVOR (what bf16 adds).
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <vector>

#include "bench_runner.hpp"

namespace favor::cli {
namespace {

constexpr int64_t kErrorRows = 1024;

// |a - b|_F / |ref|_F over `count` floats.
double relative(const float* a, const float* b, const float* ref, int64_t count) {
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < count; ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

double seconds_of(const std::function<void()>& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// fp32 and bf16 rows of one problem, timed interleaved (one call of each per round, the
// median of max(--repeats, 5) rounds each): a load that comes and goes on a shared machine
// then weighs on both alike. Memory figures from measure() (one warm call and one timed).
// Returns the bf16 row's seconds / the fp32 row's.
double timed_pair(BenchRunner& bench, int64_t n) {
  const BenchArgs& a = bench.args();
  const auto qkv = bench.inputs(a.bh, n);
  const Tensor &q = std::get<0>(qkv), &k = std::get<1>(qkv), &v = std::get<2>(qkv);
  const Projection w = Projection::draw(a.m, a.d, {ProjectionKind::orthogonal, NormMode::chi, 0});
  Tensor out({1, a.bh, n, a.d}, 0.0f);
  AttentionOptions o32, o16;
  o16.precision = Precision::bf16;
  const std::function<void()> f32 = [&] { favor_attention(q, k, v, w, out.mutable_view(), o32); };
  const std::function<void()> f16 = [&] { favor_attention(q, k, v, w, out.mutable_view(), o16); };
  Measured m32 = measure(f32, 1, 0.0), m16 = measure(f16, 1, 0.0);
  std::vector<double> t32, t16;
  for (int r = 0; r < std::max(a.repeats, 5); ++r) {
    t32.push_back(seconds_of(f32));
    t16.push_back(seconds_of(f16));
  }
  m32.seconds = median(t32);
  m16.seconds = median(t16);
  const double flops = favor_flops(bench.problem(a.bh, n), false, 0);
  nlohmann::json r32 = timed_record("favor", false, n, a.bh, num_threads(), m32, flops);
  r32["ratio_to_fp32"] = 1.0;
  bench.emit(std::move(r32));
  nlohmann::json r16 = timed_record("favor-bf16", false, n, a.bh, num_threads(), m16, flops);
  r16["ratio_to_fp32"] = m16.seconds / m32.seconds;
  r16["bf16_ran"] = bf16_available();
  bench.emit(std::move(r16));
  return m16.seconds / m32.seconds;
}

// Errors on head 0's first kErrorRows queries against all n keys (the rows of a
// bidirectional call do not depend on the other queries).
void errors(BenchRunner& bench, int64_t n, nlohmann::json& record) {
  const BenchArgs& a = bench.args();
  const auto qkv = bench.inputs(a.bh, n);
  const int64_t rows = std::min(kErrorRows, n);
  const TensorView q = TensorView::contiguous(std::get<0>(qkv).view().data, {1, 1, rows, a.d});
  const TensorView k = TensorView::contiguous(std::get<1>(qkv).view().data, {1, 1, n, a.d});
  const TensorView v = TensorView::contiguous(std::get<2>(qkv).view().data, {1, 1, n, a.d});
  const Projection w = Projection::draw(a.m, a.d, {ProjectionKind::orthogonal, NormMode::chi, 0});
  ExactOptions eo;
  eo.accumulation = Accumulation::f64;
  const Tensor exact = exact_attention(q, k, v, eo);
  AttentionOptions o;
  const Tensor f32 = favor_attention(q, k, v, w, o);
  o.precision = Precision::bf16;
  const Tensor bf16 = favor_attention(q, k, v, w, o);
  const int64_t count = rows * a.d;
  const double estimator = relative(f32.view().data, exact.view().data, exact.view().data, count);
  const double added = relative(bf16.view().data, f32.view().data, exact.view().data, count);
  const double total = relative(bf16.view().data, exact.view().data, exact.view().data, count);
  record["error_fp32_vs_exact"] = estimator;
  record["error_bf16_vs_fp32"] = added;
  record["error_bf16_vs_exact"] = total;
  if (!a.json) {
    fmt::print(
        "{:>7} relative error, head 0, {} queries: fp32 vs exact {:.3e}, bf16 vs fp32 {:.3e}"
        " ({:.1f}% of it), bf16 vs exact {:.3e}\n",
        "", rows, estimator, added, 100.0 * added / estimator, total);
  }
}

}  // namespace

void section_bf16(BenchRunner& bench) {
  const BenchArgs& a = bench.args();
  const bool ran = bf16_available();
  if (!a.json) fmt::print("{:>7} bf16 available: {}\n", "", ran ? "yes" : "no (rows run fp32)");
  for (int64_t n : a.bf16_lengths) {
    const double ratio = timed_pair(bench, n);
    if (!a.json) fmt::print("{:>7} fp32 / bf16 = {:.2f}x\n", "", 1.0 / ratio);
    errors(bench, n, bench.records().back());
  }
}

}  // namespace favor::cli
