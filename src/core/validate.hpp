#pragma once
// Argument checks shared by every entry point. Each throws favor::Error naming the
// argument, its value and the rule.
#include <optional>
#include <string>

#include "favor/attention.hpp"
#include "favor/projection.hpp"
#include "favor/tensor.hpp"

namespace favor::detail {

/// Extents >= 1, non-null data, non-negative strides.
void check_view(const TensorView& t, const std::string& name);
/// The same; with empty_n, N = 0 is allowed (a slice with no rows; data may then be null).
void check_view(const TensorView& t, const std::string& name, bool empty_n);
/// Every element finite; the message gives the first bad index.
void check_finite(const TensorView& t, const std::string& name);
/// Whether any of n floats (stride 1) is NaN or Inf (check_finite's test).
bool any_nonfinite(const float* x, int64_t n);
/// The output view: extents equal `expected`, non-null, and no overlap with `inputs`.
void check_output(const MutableTensorView& out, const Shape4& expected, const std::string& name,
                  std::initializer_list<TensorView> inputs);
/// One step of a streaming decoder: t is [batch, heads, T, dim] (any T >= 1), finite.
/// dim_name names the last extent in the message ("D", "Dv").
void check_step(const TensorView& t, int64_t batch, int64_t heads, int64_t dim,
                const std::string& name, const std::string& dim_name);
/// The inputs of a decoder's fused step (Decoder::step, VQDecoder::step): q and k
/// [B, H, 1, d], v [B, H, 1, dv], one token per row, the mask [B, 1], out [B, H, 1, dv].
void check_decode_step(const TensorView& q, const TensorView& k, const TensorView& v,
                       const MutableTensorView& out, const std::optional<KeyMaskView>& key_mask,
                       int64_t batch, int64_t heads, int64_t d, int64_t dv);
/// The inputs of a decoder's prefill (Decoder::prefill, VQDecoder::prefill): q and k
/// [B, H, T, d], v [B, H, T, dv] with one T, the mask [B, T], out [B, H, T, dv]; returns T.
int64_t check_decode_prefill(const TensorView& q, const TensorView& k, const TensorView& v,
                             const MutableTensorView& out,
                             const std::optional<KeyMaskView>& key_mask, int64_t batch,
                             int64_t heads, int64_t d, int64_t dv);
/// A key mask [batch, n] (n_name names n in the message: "Nk", "T"): non-null data when
/// n > 0, non-negative strides.
void check_key_mask(const KeyMaskView& mask, int64_t batch, int64_t n, const char* n_name);
/// The output [B, H, Nq, Dv] of an attention call that allocates it, from q and v (each
/// checked as a view; the callee validates the rest).
Tensor attention_output(const TensorView& q, const TensorView& v);
/// scale > 0 and finite when given; default 1/sqrt(d).
double resolve_scale(const std::optional<double>& scale, int64_t d);
/// W is m x d with d matching the head dim of `name`.
void check_projection(const Projection& w, int64_t d, const std::string& name);

/// Shapes of one attention call, validated together.
struct AttentionShape {
  int64_t batch, heads, nq, nk, d, dv;
};
AttentionShape check_attention_inputs(const TensorView& q, const TensorView& k, const TensorView& v,
                                      bool causal, const std::optional<KeyMaskView>& mask);
/// The same with slices of length N = 0 allowed (sequence-parallel attention, moments).
AttentionShape check_slice_inputs(const TensorView& q, const TensorView& k, const TensorView& v,
                                  bool causal, const std::optional<KeyMaskView>& mask);
AttentionShape check_inputs(const TensorView& q, const TensorView& k, const TensorView& v,
                            bool causal, const std::optional<KeyMaskView>& mask, bool empty_n);
/// check_inputs without the finiteness scan: the rules that need no values (extents,
/// strides, agreement, the key mask's shape). Bound into Python for the torch kernels of other
/// devices, which check their shapes by it and scan values on their device.
AttentionShape check_input_shapes(const TensorView& q, const TensorView& k, const TensorView& v,
                                  bool causal, const std::optional<KeyMaskView>& mask,
                                  bool empty_n);
/// The upstream gradient dy of a backward pass: a view of the output's shape [B, H, Nq, Dv],
/// finite.
void check_dy(const TensorView& dy, const AttentionShape& s);
/// Hybrid attention's rules: window >= 0, sinks >= 0 and, when either is above 0, q and k of
/// one sequence (Nq == Nk).
void check_hybrid(int64_t window, int64_t sinks, const AttentionShape& s);
/// ExactOptions::window, ::sinks: check_hybrid's rules, and f32 accumulation.
void check_window_options(const ExactOptions& options, const AttentionShape& s);

}  // namespace favor::detail
