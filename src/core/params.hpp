#pragma once
// Fills the kernels' params struct from validated inputs: shared by the forward and the
// backward facades.
#include <optional>

#include "core/validate.hpp"
#include "kernels/attention_params.hpp"

namespace favor::detail {

/// q, k, v views, sizes, sqrt(scale) and the mask; the caller adds the
/// output, the projection and the kernel.
kernels::AttentionParams attention_params(const TensorView& q, const TensorView& k,
                                          const TensorView& v, const AttentionShape& s,
                                          double scale, const std::optional<KeyMaskView>& mask);

}  // namespace favor::detail
