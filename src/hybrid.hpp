#pragma once
// Hybrid attention (AttentionOptions::window, ::sinks; docs/math.md, "Hybrid attention"):
// the facades' shared driver. Each row is the merge of parts that give unnormalised rows
// [num | den] at a log scale: the exact part (window and sinks, kernels/band_params.hpp) and
// the estimated part, which is causal FAVOR on shifted views (the keys up to i - window:
// query i of the shifted call is row i - window) and, bidirectional, the same on reversed
// views (keys from i + window). Merged: y_i = sum_p e^(L_pi - S_i) num_pi / sum_p
// e^(L_pi - S_i) den_pi, S_i = max_p L_pi; its log normaliser lse_i = S_i + log den_i.
#include <cstdint>
#include <vector>

#include "core/feature_map_params.hpp"
#include "favor/attention.hpp"
#include "favor/causal_context.hpp"
#include "kernels/attention_params.hpp"

namespace favor::detail {

/// Whether options ask for hybrid attention (window or sinks above 0).
inline bool is_hybrid(const AttentionOptions& options) {
  return options.window > 0 || options.sinks > 0;
}

/// A hybrid call's merged output into base.out (its strides); returns the zero rows. `base`
/// holds q, k, v, sizes, mask, out and the resolved map. With `context`, saves it
/// (favor/causal_context.hpp, hybrid_context_layout; emptied when there is no estimated part).
int64_t hybrid_forward(const kernels::AttentionParams& base, const ResolvedMap& resolved,
                       const AttentionOptions& options, AttentionContext* context = nullptr);

/// What the kernels leave out of a query row's estimated sums (they cancel in a plain call,
/// not against exact terms; kernels::query_log_weight): the factor of |q|^2 (-+ scale / 2 by
/// the map's key norm, or 0) and head bh's constant (the features' constant on both sides,
/// as a log).
double norm_weight(const ResolvedMap& r, const kernels::FeatureParams& fp);
double head_log_constant(const ResolvedMap& r, int64_t bh);

/// Adds the gradients of a hybrid call to bp.dq, bp.dk, bp.dv (C-contiguous, zeroed) and to
/// its parameter slices (bp.dw, dbias, dlogw, drate where set); bp.fwd as `base` above.
/// With a context saved by hybrid_forward (checked by the caller), from it; else the
/// forward is recomputed.
void hybrid_backward(const kernels::BackwardParams& bp, const ResolvedMap& resolved,
                     const AttentionOptions& options,
                     const AttentionContextView* context = nullptr);

/// Exact softmax over each query's window and sinks alone (ExactOptions::window, ::sinks:
/// the exact part with no estimated part) into base.out, and lse (B*H x N) where set.
void window_forward(const kernels::AttentionParams& base, double scale, bool causal, int64_t window,
                    int64_t sinks, double* lse = nullptr);
/// Its gradients into bp.dq, dk, dv (zeroed): from the forward's y (C-contiguous [B*H][N][Dv])
/// and lse when given, else recomputing them.
void window_backward(const kernels::BackwardParams& bp, double scale, bool causal, int64_t window,
                     int64_t sinks, const float* y = nullptr, const double* lse = nullptr);

}  // namespace favor::detail
