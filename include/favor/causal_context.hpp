#pragma once
// The layout of a causal AttentionContext (AttentionOptions::save_causal_states), for
// callers that size its arrays themselves (favor.torch's custom ops).
#include <cstdint>

namespace favor {

/// Tokens per saved chunk state of a causal context.
constexpr int64_t kCausalContextChunk = 32;

/// Saved chunk states of a causal context over n tokens: the state before each chunk and
/// after the last, ceil(n / kCausalContextChunk) + 1.
constexpr int64_t causal_context_states(int64_t n) {
  return (n + kCausalContextChunk - 1) / kCausalContextChunk + 1;
}

}  // namespace favor
