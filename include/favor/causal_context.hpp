#pragma once
// The layout of a causal or hybrid AttentionContext (AttentionOptions::save_causal_states), for
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

/// What a hybrid call (AttentionOptions::window, ::sinks) saves with save_causal_states,
/// when an estimated part has rows (window < n; else nothing). Each part is a causal view:
/// the prefix (every call) of R = n - window rows, keys up to i - window; a bidirectional
/// call's suffix, reversed, of R' = n - max(window, 1) rows (none when that is not above 0).
/// Each part's view saves as a causal call does, followed by the merge's rows:
///   states: the prefix's [heads][S][F][Dv + 1], S = causal_context_states(R), then the
///           suffix's [heads][S'][F][Dv + 1];
///   maxima: the prefix's [heads][S], the suffix's [heads][S'], then lse [heads][n] and the
///           parts' rows' log scales, [heads][R] then [heads][R'];
///   rows: the prefix's [heads][R][Dv + 1], the suffix's [heads][R'][Dv + 1], then the
///         merged y [heads][n][Dv].
/// A causal call has no suffix (R' = S' = 0).
struct HybridContextLayout {
  int64_t part_rows = 0, slots = 0;           // the prefix: R, S
  int64_t suffix_rows = 0, suffix_slots = 0;  // the suffix: R', S'
  int64_t states = 0, maxima = 0, rows = 0;   // the arrays' sizes
};

constexpr HybridContextLayout hybrid_context_layout(int64_t heads, int64_t n, int64_t features,
                                                    int64_t dv, int64_t window, bool causal) {
  HybridContextLayout l;
  if (window >= n) return l;
  l.part_rows = n - window;
  l.slots = causal_context_states(l.part_rows);
  const int64_t suffix_offset = window > 1 ? window : 1;
  if (!causal && suffix_offset < n) {
    l.suffix_rows = n - suffix_offset;
    l.suffix_slots = causal_context_states(l.suffix_rows);
  }
  const int64_t slots = l.slots + l.suffix_slots, part_rows = l.part_rows + l.suffix_rows;
  l.states = heads * slots * features * (dv + 1);
  l.maxima = heads * (slots + n + part_rows);
  l.rows = heads * (part_rows * (dv + 1) + n * dv);
  return l;
}

}  // namespace favor
