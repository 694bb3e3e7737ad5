#include "options.hpp"

namespace favor::python {

FeatureOptions feature_options(const std::string& kernel, std::optional<double> scale,
                               const std::optional<KernelFit>& fit) {
  FeatureOptions o;
  o.kernel = parse_kernel(kernel, "kernel");
  o.scale = scale;
  o.fit = fit;
  return o;
}

AttentionOptions attention_options(const std::string& kernel, bool causal,
                                   std::optional<double> scale, std::optional<KeyMaskView> key_mask,
                                   const std::optional<KernelFit>& fit) {
  AttentionOptions o;
  o.kernel = parse_kernel(kernel, "kernel");
  o.causal = causal;
  o.scale = scale;
  o.key_mask = key_mask;
  o.fit = fit;
  return o;
}

DecoderOptions decoder_options(const std::string& kernel, std::optional<double> scale,
                               const std::optional<KernelFit>& fit) {
  const FeatureOptions f = feature_options(kernel, scale, fit);
  DecoderOptions o;
  o.kernel = f.kernel;
  o.scale = f.scale;
  o.fit = f.fit;
  return o;
}

Error renamed_map_error(const Error& e) {
  const std::string what = e.what();
  if (what.rfind("map:", 0) == 0 || what.rfind("map.", 0) == 0) {
    return Error("feature_map" + what.substr(3));
  }
  return e;
}

}  // namespace favor::python
