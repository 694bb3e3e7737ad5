// favor bench's decode section: the Decoder's steps (append(k, v) + query(q), all heads at
// once) after a prefill of each --decode-positions tokens.
#include <algorithm>

#include "bench_runner.hpp"

namespace favor::cli {
namespace {

// Prefill `position` tokens, then time steps. tokens/s counts steps (one token per sequence).
void decode_row(BenchRunner& bench, int64_t position, bool report) {
  const BenchArgs& a = bench.args();
  const Kernel kernel = bench.kernel();
  const int64_t bh = a.bh, steps = 256;
  const Projection w = Projection::draw(a.m, a.d, {ProjectionKind::orthogonal, NormMode::chi, 0});
  DecoderOptions options;
  options.kernel = kernel;
  if (data_adapted(kernel)) {  // a fit from calibration rows (the decoder needs one)
    const auto calibration = bench.inputs(bh, 256, 5000);
    options.fit = fit_kernel(kernel, std::get<0>(calibration), std::get<1>(calibration));
  }
  Decoder dec(1, bh, a.d, w, options);
  const int64_t chunk = 4096;
  for (int64_t done = 0; done < position; done += chunk) {
    const int64_t t = std::min(chunk, position - done);
    const auto qkv = bench.inputs(bh, t, 7000 + done);
    dec.append(std::get<1>(qkv), std::get<2>(qkv));
  }
  const auto qkv = bench.inputs(bh, steps, 99);
  const Tensor &q = std::get<0>(qkv), &k = std::get<1>(qkv), &v = std::get<2>(qkv);
  Tensor y({1, bh, 1, a.d});
  int64_t i = 0;
  const auto step = [&] {
    const auto slice = [&](const Tensor& t) {
      return TensorView{
          t.data() + (i % steps) * a.d, {1, bh, 1, a.d}, contiguous_strides(t.shape())};
    };
    dec.append(slice(k), slice(v));
    dec.query(slice(q), y.mutable_view());
    ++i;
  };
  const Measured t = measure(
      [&] {
        for (int64_t s = 0; s < steps; ++s) step();
      },
      a.repeats, a.min_time);
  const double per_step = t.seconds / double(steps);
  if (!report) return;
  bench.emit({{"method", "decode"},
              {"causal", true},
              {"n", position},
              {"bh", bh},
              {"threads", num_threads()},
              {"seconds", per_step},
              {"gflops", favor::bench::decode_step_flops(bench.problem(bh, 1)) / per_step / 1e9},
              {"tokens_per_s", 1.0 / per_step},
              {"peak_heap_mb", t.heap_mb},
              {"rss_growth_mb", t.rss_mb}});
}

}  // namespace

void section_decode(BenchRunner& bench) {
  const std::vector<int64_t>& positions = bench.args().decode_positions;
  if (positions.empty()) return;
  decode_row(bench, positions.front(), false);  // warm-up (thread pool, caches): not reported
  for (int64_t pos : positions) decode_row(bench, pos, true);
}

}  // namespace favor::cli
