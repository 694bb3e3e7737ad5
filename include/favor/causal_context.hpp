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

/// What a causal hybrid call (AttentionOptions::window, ::sinks) saves with
/// save_causal_states, when its estimated part has rows (window < n; else nothing): the
/// part's view of R = n - window rows saves as a causal call does, followed by the merge's
/// rows.
///   states: [heads][S][F][Dv + 1], S = causal_context_states(R);
///   maxima: [heads][S], then lse [heads][n] and the part's rows' log scales [heads][R];
///   rows: the part's [heads][R][Dv + 1], then the merged y [heads][n][Dv].
struct HybridContextLayout {
  int64_t part_rows = 0, slots = 0;
  int64_t states = 0, maxima = 0, rows = 0;  // the arrays' sizes
};

constexpr HybridContextLayout hybrid_context_layout(int64_t heads, int64_t n, int64_t features,
                                                    int64_t dv, int64_t window) {
  HybridContextLayout l;
  if (window >= n) return l;
  l.part_rows = n - window;
  l.slots = causal_context_states(l.part_rows);
  l.states = heads * l.slots * features * (dv + 1);
  l.maxima = heads * (l.slots + n + l.part_rows);
  l.rows = heads * (l.part_rows * (dv + 1) + n * dv);
  return l;
}

}  // namespace favor
