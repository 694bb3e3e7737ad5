#include "core/parameter_grads.hpp"

#include <cmath>

namespace favor::detail {
namespace {

// out[set][i] = sum over (batch, head) bh with bh % sets == set of per_bh[bh][i].
std::vector<float> reduce_sets(const std::vector<float>& per_bh, int64_t batch_heads, int64_t sets,
                               int64_t size) {
  std::vector<float> out(static_cast<size_t>(sets * size), 0.0f);
  for (int64_t bh = 0; bh < batch_heads; ++bh) {
    float* dst = out.data() + (bh % sets) * size;
    const float* src = per_bh.data() + bh * size;
    for (int64_t i = 0; i < size; ++i) dst[i] += src[i];
  }
  return out;
}

}  // namespace

ParameterGrads::ParameterGrads(const ResolvedMap& resolved, const FeatureMap& map,
                               const AttentionShape& s, bool wanted, kernels::BackwardParams& bp)
    : resolved_(resolved), batch_heads_(s.batch * s.heads), wanted_(wanted) {
  if (!wanted) return;
  const int64_t m = resolved.m, d = resolved.d, bhs = batch_heads_;
  // One slice per (batch, head) for dW and db, summed into the parameter sets in head order
  // by finish(): the result does not depend on which thread ran which head (a shared sum of
  // per-thread partials would), so a rerun gives the same bits. Memory B*H (m d + m) floats.
  dw_.assign(static_cast<size_t>(bhs * m * d), 0.0f);
  if (resolved.adapted.heads || !map.bias.empty())
    dbias_.assign(static_cast<size_t>(bhs * m), 0.0f);
  bp.dw = dw_.data();
  bp.dbias = dbias_.empty() ? nullptr : dbias_.data();
  if (!map.lambda.empty()) {
    dlogw_.assign(static_cast<size_t>(bhs * m), 0.0f);
    bp.dlogw = dlogw_.data();
  }
  if (!resolved.decay_rate.empty()) {
    drate_.assign(static_cast<size_t>(bhs), 0.0);
    bp.drate = drate_.data();
  }
}

void ParameterGrads::finish(const FeatureMap& map, AttentionGrads& g) const {
  if (!wanted_) return;
  const int64_t m = resolved_.m, d = resolved_.d;
  if (const int64_t sets = resolved_.adapted.heads) {  // FAVOR++ / FAVOR#: W (and decay)
    const KernelFit& fit = map.fit ? *map.fit : resolved_.adapted.fitted;
    g.dw = projection_grad(fit, map.projection, reduce_sets(dw_, batch_heads_, sets, m * d).data(),
                           reduce_sets(dbias_, batch_heads_, sets, m).data());
  } else {
    // Learned weights: one gradient per parameter set; a shared projection: one sum.
    g.dw = reduce_sets(dw_, batch_heads_, map.weights.empty() ? 1 : map.heads, m * d);
    if (!dbias_.empty()) g.dbias = reduce_sets(dbias_, batch_heads_, map.heads, m);
  }
  if (!dlogw_.empty()) {
    // l = log lambda^2: dL/dlambda = dL/dl * 2 / lambda, in double: 2 / lambda overflows
    // float for a denormal lambda, and 0 * inf was NaN where dL/dl = 0 (fuzz_attention).
    g.dlambda = reduce_sets(dlogw_, batch_heads_, map.heads, m);
    for (size_t i = 0; i < g.dlambda.size(); ++i) {
      g.dlambda[i] = static_cast<float>(static_cast<double>(g.dlambda[i]) * 2.0 /
                                        static_cast<double>(map.lambda[i]));
    }
  }
  if (!drate_.empty()) {
    // rate = -log gamma: dL/dgamma = -dL/drate / gamma.
    const auto sets = static_cast<int64_t>(resolved_.decay_rate.size());
    g.ddecay.assign(static_cast<size_t>(sets), 0.0);
    for (int64_t bh = 0; bh < batch_heads_; ++bh) g.ddecay[bh % sets] += drate_[bh];
    for (int64_t i = 0; i < sets; ++i) g.ddecay[i] *= -std::exp(resolved_.decay_rate[i]);
  }
}

}  // namespace favor::detail
