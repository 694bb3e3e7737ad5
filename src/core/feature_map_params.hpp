#pragma once
// From a favor::FeatureMap (and the decay of the options) to the kernels' FeatureParams: the
// one place where a map's kind, projection, fit and learned parameters become pointers and
// counts. Shared by the forward and backward facades and the decoder.
#include <cstdint>
#include <optional>
#include <vector>

#include "core/adapted.hpp"
#include "core/validate.hpp"
#include "favor/attention.hpp"
#include "favor/decoder.hpp"
#include "favor/feature_map.hpp"
#include "kernels/feature_params.hpp"

namespace favor::detail {

/// A map resolved for one call. Owns everything params() points into; copy freely.
struct ResolvedMap {
  Kernel kernel = Kernel::positive;
  int64_t m = 0, d = 0;
  double scale = 1.0;
  AdaptedProjection adapted;  // FAVOR++ / FAVOR#: per-head projections and log biases
  std::vector<float> w;       // [w_sets][m][d], or empty while borrowed
  int64_t w_sets = 1;
  // A per-call map borrows the FeatureMap's weights (resolve_map with borrow): w_view points
  // at them, w stays empty; no m x d copy per call. Valid while that FeatureMap lives.
  const float* w_view = nullptr;
  size_t w_view_size = 0;
  std::vector<float> bias;  // [bias_sets][m] or empty
  int64_t bias_sets = 1;
  std::vector<float> key_logw;  // [lambda_sets][m] or empty: log lambda^2
  int64_t lambda_sets = 1;
  std::vector<double> decay_rate;  // [decay_sets]: -log gamma, or empty (no decay)
  int64_t decay_sets = 1;

  kernels::FeatureParams params() const;
  /// A hash of every parameter above, for saved contexts (computed on demand: it reads all
  /// the parameters, so calls without a context do not pay for it).
  uint64_t fingerprint() const;
};

[[noreturn]] void map_options_error(const char* function);

/// The FeatureMap of a Projection overload: {w, options.kernel, options.scale, options.fit}
/// (Options: AttentionOptions or DecoderOptions).
template <class Options>
FeatureMap map_of(const Projection& w, const Options& options) {
  FeatureMap map(w, options.kernel);
  map.scale = options.scale;
  map.fit = options.fit;
  return map;
}
/// options without kernel, scale and fit (what the FeatureMap overloads take).
template <class Options>
Options without_map(const Options& options) {
  Options o = options;
  o.kernel = Kernel::positive;
  o.scale.reset();
  o.fit.reset();
  return o;
}
/// Refuses options.kernel, .scale or .fit away from their defaults next to a FeatureMap.
template <class Options>
void check_map_options(const Options& options, const char* function) {
  if (options.kernel != Kernel::positive || options.scale || options.fit)
    map_options_error(function);
}
/// Checks `decay` (1 or `heads` values in (0, 1]; causal only); returns -log gamma per value
/// (empty without decay).
std::vector<double> decay_rates(const std::vector<double>& decay, int64_t heads, bool causal,
                                const char* argument = "decay");

/// Validates `map` for a call of shape s (check_feature_map) and resolves it. q and k feed a
/// FAVOR++ / FAVOR# fit when the map has none (bidirectional only; causal throws).
/// borrow: the result points at map's weights instead of copying them (a call that ends
/// before map does: favor_attention, its backward).
ResolvedMap resolve_map(const FeatureMap& map, const AttentionShape& s, const TensorView& q,
                        const TensorView& k, const AttentionOptions& options, bool borrow = false);
/// The same without data to fit (decoder, features()): FAVOR++ / FAVOR# need map.fit.
ResolvedMap resolve_fixed_map(const FeatureMap& map, int64_t batch, int64_t heads,
                              const std::vector<double>& decay);

}  // namespace favor::detail
