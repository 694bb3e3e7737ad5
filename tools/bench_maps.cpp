// favor bench's maps section: the cost of the DiJiang and learned maps (feature_map.hpp) at
// each --estimator-lengths N against FAVOR+ (positive, shared W) timed just before, forward
// and backward (with the parameter gradients): feature weights lambda, per-head learned W, b
// and lambda, Hedgehog (m / 2 projections: the same F) and, causal, the decay.
// ratio_to_positive = seconds / FAVOR+'s.
#include <fmt/core.h>

#include <string>
#include <utility>
#include <vector>

#include "bench_runner.hpp"

namespace favor::cli {
namespace {

using namespace favor::bench;

void map_rows(BenchRunner& bench, int64_t n, bool causal) {
  const BenchArgs& a = bench.args();
  const auto qkv = bench.inputs(a.bh, n);
  const Tensor &q = std::get<0>(qkv), &k = std::get<1>(qkv), &v = std::get<2>(qkv);
  const Tensor dy = gaussian_rows({1, a.bh, n, a.d}, 44);
  const int64_t heads = a.bh, m = a.m;
  auto draw = [&](int64_t rows) {
    return Projection::draw(rows, a.d, {ProjectionKind::orthogonal, NormMode::chi, 0});
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
    const FeatureMap& map = named.second;
    AttentionOptions o;
    o.causal = causal;
    if (name == "decay") o.decay.assign(static_cast<size_t>(heads), 0.99);
    Tensor out({1, a.bh, n, a.d});
    const Measured f = measure([&] { favor_attention(q, k, v, map, out.mutable_view(), o); },
                               a.repeats, a.min_time);
    const bool grads = name != "positive";
    const Measured b = measure([&] { favor_attention_backward(q, k, v, dy, map, o, grads); },
                               a.repeats, a.min_time);
    if (name == "positive") {
      base_fwd = f.seconds;
      base_bwd = b.seconds;
    }
    const Problem prob{a.bh, n, a.d, a.d, map.m(), map.features()};
    const int64_t chunk = kernel_info().causal_chunk;
    nlohmann::json rf =
        timed_record("favor", causal, n, a.bh, num_threads(), f, favor_flops(prob, causal, chunk));
    rf.update({{"map", name}, {"pass", "forward"}, {"ratio_to_positive", f.seconds / base_fwd}});
    bench.emit(std::move(rf));
    nlohmann::json rb = timed_record("favor", causal, n, a.bh, num_threads(), b,
                                     favor_backward_flops(prob, causal, chunk));
    rb.update({{"map", name},
               {"pass", "backward"},
               {"parameter_grads", grads},
               {"ratio_to_positive", b.seconds / base_bwd}});
    bench.emit(std::move(rb));
    if (!a.json) {
      fmt::print("{:>7} {} / positive = {:.2f} forward, {:.2f} backward\n", "", name,
                 f.seconds / base_fwd, b.seconds / base_bwd);
    }
  }
}

}  // namespace

void section_maps(BenchRunner& bench) {
  for (int64_t n : bench.args().estimator_lengths) {
    for (bool causal : {false, true}) map_rows(bench, n, causal);
  }
}

}  // namespace favor::cli
