#pragma once
// A 64-bit fingerprint (multiply-xor over the bits of every element, in logical order) of what a
// saved attention context depends on: k, v, W, the key mask and the options. Used to refuse
// a context that came from other inputs. O(N (D + Dv)).
#include <cstdint>

#include "favor/attention.hpp"

namespace favor::detail {

uint64_t context_fingerprint(const TensorView& k, const TensorView& v, const Projection& w,
                             const AttentionOptions& options, double scale);

}  // namespace favor::detail
