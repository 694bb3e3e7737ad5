#pragma once
// The C++ option structs from the keyword arguments every binding takes.
#include <optional>
#include <string>

#include "favor/favor.hpp"

namespace favor::python {

FeatureOptions feature_options(const std::string& kernel, std::optional<double> scale,
                               const std::optional<KernelFit>& fit);
AttentionOptions attention_options(const std::string& kernel, bool causal,
                                   std::optional<double> scale, std::optional<KeyMaskView> key_mask,
                                   const std::optional<KernelFit>& fit);
DecoderOptions decoder_options(const std::string& kernel, std::optional<double> scale,
                               const std::optional<KernelFit>& fit);

/// The error `e` with the C++ argument name "map" (FeatureMap overloads) replaced by
/// "feature_map", the name Python callers give it; other errors unchanged.
Error renamed_map_error(const Error& e);

}  // namespace favor::python
