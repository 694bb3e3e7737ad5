#pragma once
// The gradients of a feature map's parameters: buffers the backward kernels write (per
// (batch, head), or one sum) and their reduction into the map's parameter sets
// (AttentionGrads::dw, dbias, dlambda, ddecay).
#include <vector>

#include "core/feature_map_params.hpp"
#include "favor/backward.hpp"
#include "kernels/attention_params.hpp"

namespace favor::detail {

class ParameterGrads {
 public:
  /// Points bp's gradient outputs at buffers for what `map` and the decay have (nothing when
  /// `wanted` is false).
  ParameterGrads(const ResolvedMap& resolved, const FeatureMap& map, const AttentionShape& s,
                 bool wanted, kernels::BackwardParams& bp);
  /// Reduces the buffers into g (chain rules: FAVOR++ / FAVOR# transform, lambda from
  /// log lambda^2, gamma from -log gamma).
  void finish(const FeatureMap& map, AttentionGrads& g) const;

 private:
  const ResolvedMap& resolved_;
  int64_t batch_heads_ = 0;
  bool wanted_ = false;
  std::vector<float> dw_, dbias_, dlogw_;  // as the kernels write them
  std::vector<double> drate_;
};

}  // namespace favor::detail
