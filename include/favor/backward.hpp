#pragma once
/// \file backward.hpp
/// Gradients of FAVOR and exact attention, for training and fine-tuning.
#include <vector>

#include "favor/attention.hpp"
#include "favor/projection.hpp"
#include "favor/tensor.hpp"

namespace favor {

/// dL/dq, dL/dk, dL/dv (shapes of q, k, v) and, when asked for, dL/dW (m x d, row-major).
struct AttentionGrads {
  Tensor dq, dk, dv;
  std::vector<float> dw;  ///< empty unless requested
  /// With a FeatureMap and with_parameter_grads (each empty unless the map or the options have
  /// the parameter): dw is [heads][m][d] when map.weights is set (else dL/dW of the shared
  /// projection, m x d); dbias [heads][m]; dlambda [heads][m]; ddecay one per decay value.
  std::vector<float> dbias, dlambda;
  std::vector<double> ddecay;
};

/// Backward pass of favor_attention with the same inputs and options: given dy = dL/dy
/// [B, H, Nq, Dv], returns the gradients of L. The stabiliser's shifts are constants of the
/// backward pass (they cancel in the output, so the gradient is exact: docs/gradients.md).
/// Rows that the forward pass defined as zeros (no visible key, trig denominator <= 0)
/// pass no gradient. Memory O(N (D + Dv) + F Dv) per head; causal attention recomputes
/// chunk states instead of storing them. with_projection_grad also returns dL/dW (FAVOR++ /
/// FAVOR#: through the fitted per-head transform, the fit held fixed). A context
/// saved by the bidirectional forward call skips the recomputation of the key state; it
/// must come from the same k, v, W, mask and options (checked; else favor::Error).
AttentionGrads favor_attention_backward(TensorView q, TensorView k, TensorView v, TensorView dy,
                                        const Projection& w, const AttentionOptions& options = {},
                                        bool with_projection_grad = false,
                                        const AttentionContext* context = nullptr);

/// Backward pass of favor_attention with a FeatureMap: dq, dk, dv and, with
/// with_parameter_grads, the gradients of the map's parameters (dw, dbias, dlambda) and of the
/// decay (ddecay). Same rules as above (options.kernel, .scale, .fit at their defaults).
AttentionGrads favor_attention_backward(TensorView q, TensorView k, TensorView v, TensorView dy,
                                        const FeatureMap& map, const AttentionOptions& options = {},
                                        bool with_parameter_grads = false,
                                        const AttentionContext* context = nullptr);

/// The same two from a context held elsewhere (AttentionContextView: the arrays borrowed,
/// e.g. from the tensors a framework kept between forward and backward; the same checks).
AttentionGrads favor_attention_backward(TensorView q, TensorView k, TensorView v, TensorView dy,
                                        const Projection& w, const AttentionOptions& options,
                                        bool with_projection_grad,
                                        const AttentionContextView& context);
AttentionGrads favor_attention_backward(TensorView q, TensorView k, TensorView v, TensorView dy,
                                        const FeatureMap& map, const AttentionOptions& options,
                                        bool with_parameter_grads,
                                        const AttentionContextView& context);

/// Backward pass of exact softmax attention (blockwise, recomputing probabilities from
/// the row log-sum-exp; never N x N). Rows with no visible key pass no gradient.
AttentionGrads exact_attention_backward(TensorView q, TensorView k, TensorView v, TensorView dy,
                                        const ExactOptions& options = {});

/// The same for a windowed call (ExactOptions::window or ::sinks) from what its forward
/// saved: its output y and its context (exact_attention with an ExactContext), checked
/// against q, k, v, y, the mask and the options (else favor::Error); the band's forward is
/// not rerun. Same gradients as the recomputing overload. dy is scanned for NaN and Inf, q,
/// k and v only when the context does not match them (the forward scanned them).
AttentionGrads exact_attention_backward(TensorView q, TensorView k, TensorView v, TensorView dy,
                                        TensorView y, const ExactContext& context,
                                        const ExactOptions& options);

}  // namespace favor
