#pragma once
// A 64-bit fingerprint (multiply-xor over the bits of every element, in logical order) of what a
// saved attention context depends on: k, v, the key mask and causal (the feature map has its
// own, detail::ResolvedMap::fingerprint, which callers combine with it). Used to refuse a
// context that came from other inputs. O(N (D + Dv)).
#include <cstdint>
#include <memory>

#include "favor/attention.hpp"

namespace favor::detail {

/// Causal or hybrid: q too (such a context saves each row's [num | den]).
uint64_t context_fingerprint(const TensorView& q, const TensorView& k, const TensorView& v,
                             const AttentionOptions& options);

/// A windowed exact call's context (ExactContext): q, k, v, its output y, the mask, causal,
/// the resolved scale, window and sinks.
uint64_t exact_context_fingerprint(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const TensorView& y, const ExactOptions& options, double scale);

/// exact_context_fingerprint in two steps around the forward's kernel: q, k and v hashed first
/// (with check_finite, each scanned for NaN and Inf in the same pass, check_finite's error:
/// a forward that saves a context then reads its inputs once for both), then finish with y.
class ExactInputsFingerprint {
 public:
  ExactInputsFingerprint(const TensorView& q, const TensorView& k, const TensorView& v,
                         bool check_finite);
  ~ExactInputsFingerprint();
  uint64_t finish(const TensorView& y, const ExactOptions& options, double scale) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace favor::detail
