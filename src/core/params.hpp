#pragma once
// Fills the kernels' params struct from validated inputs: shared by the forward and the
// backward facades.
#include <optional>

#include "core/validate.hpp"
#include "cpu/attention_params.hpp"

namespace favor::detail {

/// q, k, v views, sizes, sqrt(scale), the mask and the thread count; the caller adds the
/// output, the projection and the kernel.
cpu::AttentionParams attention_params(const TensorView& q, const TensorView& k, const TensorView& v,
                                      const AttentionShape& s, double scale,
                                      const std::optional<KeyMaskView>& mask);

}  // namespace favor::detail
