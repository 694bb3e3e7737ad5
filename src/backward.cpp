// The backward facade: validates arguments like the forward pass, allocates zeroed
// gradients and dispatches to the CPU kernels.
#include "favor/backward.hpp"

#include <cmath>
#include <vector>

#include "core/feature_map_params.hpp"
#include "core/fingerprint.hpp"
#include "core/parameter_grads.hpp"
#include "core/params.hpp"
#include "core/validate.hpp"
#include "favor/causal_context.hpp"
#include "favor/error.hpp"
#include "favor/runtime.hpp"
#include "hybrid.hpp"
#include "kernels/backend.hpp"

namespace favor {
namespace {

struct Checked {
  detail::AttentionShape s;
  double scale;
};

Checked check_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& dy, bool causal, const std::optional<KeyMaskView>& mask,
                       const std::optional<double>& scale) {
  const auto s = detail::check_attention_inputs(q, k, v, causal, mask);
  detail::check_dy(dy, s);
  return {s, detail::resolve_scale(scale, s.d)};
}

kernels::BackwardParams make_params(const TensorView& q, const TensorView& k, const TensorView& v,
                                    const TensorView& dy, const Checked& c,
                                    const std::optional<KeyMaskView>& mask, AttentionGrads& g) {
  kernels::BackwardParams bp{};
  bp.fwd = detail::attention_params(q, k, v, c.s, c.scale, mask);
  bp.dy = dy.data;
  bp.dy_strides = dy.strides;
  g.dq = Tensor({c.s.batch, c.s.heads, c.s.nq, c.s.d});
  g.dk = Tensor({c.s.batch, c.s.heads, c.s.nk, c.s.d});
  g.dv = Tensor({c.s.batch, c.s.heads, c.s.nk, c.s.dv});
  bp.dq = g.dq.data();
  bp.dk = g.dk.data();
  bp.dv = g.dv.data();
  return bp;
}

// A hybrid call's context (hybrid_context_layout) must be the forward's of these inputs.
void check_hybrid_context(const AttentionContextView& c, const TensorView& q, const TensorView& k,
                          const TensorView& v, const AttentionOptions& options,
                          const detail::ResolvedMap& resolved, const detail::AttentionShape& s,
                          int64_t features) {
  if (!c.valid()) {
    throw Error(
        "context: only a hybrid forward call with save_causal_states and a window shorter "
        "than the sequence saves a context (this one is empty)");
  }
  const HybridContextLayout l = hybrid_context_layout(s.batch * s.heads, s.nq, features, s.dv,
                                                      options.window, options.causal);
  if (c.states_size != static_cast<size_t>(l.states) ||
      c.maxima_size != static_cast<size_t>(l.maxima) ||
      c.rows_size != static_cast<size_t>(l.rows) ||
      c.fingerprint != (detail::context_fingerprint(q, k, v, options) ^ resolved.fingerprint())) {
    throw Error(
        "context: it was saved for other q, k, v, W, mask or options than this backward call's");
  }
}

AttentionGrads map_backward(TensorView q, TensorView k, TensorView v, TensorView dy,
                            const FeatureMap& map, const AttentionOptions& options,
                            bool with_parameter_grads, const AttentionContextView* context) {
  detail::check_map_options(options, "favor_attention_backward");
  const auto s = detail::check_attention_inputs(q, k, v, options.causal, options.key_mask);
  detail::check_dy(dy, s);
  detail::check_projection(map.projection, s.d, "q and k");
  const detail::ResolvedMap resolved = detail::resolve_map(map, s, q, k, options, /*borrow=*/true);
  AttentionGrads g;
  kernels::BackwardParams bp =
      make_params(q, k, v, dy, Checked{s, resolved.scale}, options.key_mask, g);
  bp.fwd.map = resolved.params();
  detail::check_hybrid(options.window, options.sinks, s);
  if (detail::is_hybrid(options)) {  // from a saved context, or recomputing the forward
    if (context) check_hybrid_context(*context, q, k, v, options, resolved, s, map.features());
    detail::ParameterGrads pg(resolved, map, s, with_parameter_grads, bp);
    detail::hybrid_backward(bp, resolved, options, context);
    pg.finish(map, g);
    return g;
  }
  if (context) {
    const int64_t F = map.features(), heads = s.batch * s.heads;
    if (!context->valid()) {
      throw Error(
          "context: only a bidirectional forward call, or a causal one with "
          "save_causal_states, saves a context (this one is empty)");
    }
    const int64_t states = options.causal ? causal_context_states(s.nq) : 1;
    if (context->states_size != static_cast<size_t>(heads * states * F * (s.dv + 1)) ||
        context->maxima_size != static_cast<size_t>(heads * states) ||
        context->rows_size !=
            (options.causal ? static_cast<size_t>(heads * s.nq * (s.dv + 1)) : 0) ||
        context->fingerprint !=
            (detail::context_fingerprint(q, k, v, options) ^ resolved.fingerprint())) {
      throw Error(
          "context: it was saved for other q, k, v, W, mask or options than this backward call's");
    }
    if (options.causal) {
      bp.ctx_chunk_states = context->states;
      bp.ctx_chunk_maxima = context->maxima;
      bp.ctx_rows = context->rows;
    } else {
      bp.ctx_states = context->states;
      bp.ctx_maxima = context->maxima;
    }
  }
  detail::ParameterGrads pg(resolved, map, s, with_parameter_grads, bp);
  if (options.causal) {
    kernels::backend().favor_backward_causal(bp);
  } else {
    kernels::backend().favor_backward_bidirectional(bp);
  }
  pg.finish(map, g);
  return g;
}

}  // namespace

AttentionGrads favor_attention_backward(TensorView q, TensorView k, TensorView v, TensorView dy,
                                        const FeatureMap& map, const AttentionOptions& options,
                                        bool with_parameter_grads,
                                        const AttentionContext* context) {
  if (!context) return map_backward(q, k, v, dy, map, options, with_parameter_grads, nullptr);
  const AttentionContextView view = context->view();
  return map_backward(q, k, v, dy, map, options, with_parameter_grads, &view);
}

AttentionGrads favor_attention_backward(TensorView q, TensorView k, TensorView v, TensorView dy,
                                        const FeatureMap& map, const AttentionOptions& options,
                                        bool with_parameter_grads,
                                        const AttentionContextView& context) {
  return map_backward(q, k, v, dy, map, options, with_parameter_grads, &context);
}

AttentionGrads favor_attention_backward(TensorView q, TensorView k, TensorView v, TensorView dy,
                                        const Projection& w, const AttentionOptions& options,
                                        bool with_projection_grad,
                                        const AttentionContext* context) {
  return favor_attention_backward(q, k, v, dy, detail::map_of(w, options),
                                  detail::without_map(options), with_projection_grad, context);
}

AttentionGrads favor_attention_backward(TensorView q, TensorView k, TensorView v, TensorView dy,
                                        const Projection& w, const AttentionOptions& options,
                                        bool with_projection_grad,
                                        const AttentionContextView& context) {
  return map_backward(q, k, v, dy, detail::map_of(w, options), detail::without_map(options),
                      with_projection_grad, &context);
}

AttentionGrads exact_attention_backward(TensorView q, TensorView k, TensorView v, TensorView dy,
                                        const ExactOptions& options) {
  const Checked c = check_backward(q, k, v, dy, options.causal, options.key_mask, options.scale);
  AttentionGrads g;
  const kernels::BackwardParams bp = make_params(q, k, v, dy, c, options.key_mask, g);
  if (options.window != 0 || options.sinks != 0) {
    detail::check_window_options(options, c.s);
    detail::window_backward(bp, c.scale, options.causal, options.window, options.sinks);
    return g;
  }
  kernels::backend().exact_attention_backward(bp, options.causal);
  return g;
}

AttentionGrads exact_attention_backward(TensorView q, TensorView k, TensorView v, TensorView dy,
                                        TensorView y, const ExactContext& context,
                                        const ExactOptions& options) {
  // q, k and v are not scanned for finite values here when the context is theirs: its
  // forward scanned them, and its fingerprint (a 64-bit hash of q, k, v and y: only a
  // collision would pass other inputs) vouches for these being the same bits. dy is scanned;
  // q, k and v when the context is refused, before its error, so that a non-finite input is
  // still named as such (after the options' and y's shape errors).
  const auto s = detail::check_input_shapes(q, k, v, options.causal, options.key_mask, false);
  detail::check_dy(dy, s);
  const Checked c{s, detail::resolve_scale(options.scale, s.d)};
  if (options.window == 0 && options.sinks == 0) {
    throw Error(
        "context: only a windowed exact call (ExactOptions::window or ::sinks) saves "
        "a context; call exact_attention_backward without one");
  }
  detail::check_window_options(options, c.s);
  const Shape4 out_shape{c.s.batch, c.s.heads, c.s.nq, c.s.dv};
  if (y.shape != out_shape) {
    throw Error("y: shape " + shape_string(y.shape) + " must be the forward's output " +
                shape_string(out_shape));
  }
  const int64_t rows = c.s.batch * c.s.heads * c.s.nq;
  if (static_cast<int64_t>(context.lse.size()) != rows ||
      context.fingerprint != detail::exact_context_fingerprint(q, k, v, y, options, c.scale)) {
    detail::check_attention_inputs(q, k, v, options.causal, options.key_mask);
    throw Error(
        "context: saved by a forward of other inputs or options (it must come from "
        "exact_attention with these q, k, v, output, mask and options)");
  }
  AttentionGrads g;
  const kernels::BackwardParams bp = make_params(q, k, v, dy, c, options.key_mask, g);
  std::vector<float> packed;  // the band's backward reads y C-contiguous
  const float* y_rows = y.data;
  if (y.strides != contiguous_strides(y.shape)) {
    packed.reserve(static_cast<size_t>(y.numel()));
    for (int64_t b = 0; b < y.shape[0]; ++b)
      for (int64_t h = 0; h < y.shape[1]; ++h)
        for (int64_t n = 0; n < y.shape[2]; ++n)
          for (int64_t x = 0; x < y.shape[3]; ++x) packed.push_back(y.at(b, h, n, x));
    y_rows = packed.data();
  }
  detail::window_backward(bp, c.scale, options.causal, options.window, options.sinks, y_rows,
                          context.lse.data());
  return g;
}

}  // namespace favor
