// Google Benchmark target: the same problems as `favor bench`, with GFLOP/s from the cost
// model (cost_model.hpp) as counters. Run: build/bench/favor_gbench [--benchmark_filter=...]
// Threads: FAVOR_NUM_THREADS (printed in the context).
#include <benchmark/benchmark.h>

#include "blas_yardstick.hpp"

#include <cmath>

#include "cost_model.hpp"
#include "favor/favor.hpp"

namespace {
using favor::bench::Problem;

constexpr int64_t kDim = 64, kFeatures = 256;

favor::Tensor rows(int64_t bh, int64_t n, uint64_t seed, double norm) {
  const favor::Projection p = favor::Projection::draw(
      bh * n, kDim, {favor::ProjectionKind::iid, favor::NormMode::chi, seed});
  favor::Tensor t({1, bh, n, kDim}, p.matrix());
  for (int64_t r = 0; norm > 0 && r < bh * n; ++r) {
    double n2 = 0;
    for (int64_t x = 0; x < kDim; ++x)
      n2 += double(t.data()[r * kDim + x]) * t.data()[r * kDim + x];
    for (int64_t x = 0; x < kDim; ++x)
      t.data()[r * kDim + x] *= static_cast<float>(norm / std::sqrt(n2));
  }
  return t;
}

void set_rate(benchmark::State& state, double flops_per_iteration, double tokens_per_iteration) {
  state.counters["GFLOP"] =
      benchmark::Counter(flops_per_iteration * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tokens"] =
      benchmark::Counter(tokens_per_iteration, benchmark::Counter::kIsIterationInvariantRate);
}

// Args: N, B*H, causal.
void BM_Favor(benchmark::State& state) {
  const int64_t n = state.range(0), bh = state.range(1);
  const bool causal = state.range(2) != 0;
  const double norm = std::pow(double(kDim), 0.25);
  const favor::Tensor q = rows(bh, n, 1, norm), k = rows(bh, n, 2, norm), v = rows(bh, n, 3, 0);
  const favor::Projection w = favor::Projection::draw(kFeatures, kDim);
  favor::Tensor out({1, bh, n, kDim});
  favor::AttentionOptions o;
  o.causal = causal;
  for (auto _ : state) favor::favor_attention(q, k, v, w, out.mutable_view(), o);
  set_rate(state,
           favor::bench::favor_flops({bh, n, kDim, kDim, kFeatures, kFeatures}, causal,
                                     favor::kernel_info().causal_chunk),
           double(bh * n));
}

void BM_Exact(benchmark::State& state) {
  const int64_t n = state.range(0), bh = state.range(1);
  const bool causal = state.range(2) != 0;
  const double norm = std::pow(double(kDim), 0.25);
  const favor::Tensor q = rows(bh, n, 1, norm), k = rows(bh, n, 2, norm), v = rows(bh, n, 3, 0);
  favor::Tensor out({1, bh, n, kDim});
  favor::ExactOptions o;
  o.causal = causal;
  for (auto _ : state) favor::exact_attention(q, k, v, out.mutable_view(), o);
  set_rate(state, favor::bench::exact_flops({bh, n, kDim, kDim, kFeatures, kFeatures}, causal),
           double(bh * n));
}

// Args: position. One step appends one token and queries one, for B*H = 8 heads.
void BM_Decode(benchmark::State& state) {
  const int64_t bh = 8, position = state.range(0);
  const favor::Projection w = favor::Projection::draw(kFeatures, kDim);
  favor::Decoder dec(1, bh, kDim, w);
  for (int64_t done = 0; done < position; done += 4096) {
    const int64_t t = std::min<int64_t>(4096, position - done);
    dec.append(rows(bh, t, 10 + done, 2.83), rows(bh, t, 20 + done, 0));
  }
  const favor::Tensor q = rows(bh, 1, 4, 2.83), k = rows(bh, 1, 5, 2.83), v = rows(bh, 1, 6, 0);
  favor::Tensor y({1, bh, 1, kDim});
  for (auto _ : state) {
    dec.append(k, v);
    dec.query(q, y.mutable_view());
  }
  set_rate(state, favor::bench::decode_step_flops({bh, 1, kDim, kDim, kFeatures, kFeatures}), 1.0);
}

void BM_Sgemm(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::vector<float> a(n * n, 1.0f), b(n * n, 0.5f), c(n * n);
  const favor::bench::BlasThreads lend(favor::num_threads());
  for (auto _ : state) favor::bench::sgemm_square(n, a.data(), b.data(), c.data());
  set_rate(state, favor::bench::sgemm_flops(n), 0.0);
}

BENCHMARK(BM_Sgemm)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Favor)
    ->ArgsProduct({benchmark::CreateRange(256, 65536, 4), {8}, {0, 1}})
    ->Args({65536, 1, 0})
    ->Args({65536, 1, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_Exact)
    ->ArgsProduct({benchmark::CreateRange(256, 4096, 4), {8}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_Decode)->Arg(1024)->Arg(65536)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::AddCustomContext("favor", favor::build_info());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
