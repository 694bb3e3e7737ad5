// The backward facade: validates arguments like the forward pass, allocates zeroed
// gradients and dispatches to the CPU kernels.
#include "favor/backward.hpp"

#include <cmath>
#include <vector>

#include "core/adapted.hpp"
#include "core/fingerprint.hpp"
#include "core/params.hpp"
#include "core/validate.hpp"
#include "cpu/attention_params.hpp"
#include "cpu/exact_attention.hpp"
#include "favor/error.hpp"
#include "favor/runtime.hpp"

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

cpu::BackwardParams make_params(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& dy, const Checked& c,
                                const std::optional<KeyMaskView>& mask, AttentionGrads& g) {
  cpu::BackwardParams bp{};
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

}  // namespace

AttentionGrads favor_attention_backward(TensorView q, TensorView k, TensorView v, TensorView dy,
                                        const Projection& w, const AttentionOptions& options,
                                        bool with_projection_grad,
                                        const AttentionContext* context) {
  const Checked c = check_backward(q, k, v, dy, options.causal, options.key_mask, options.scale);
  detail::check_projection(w, c.s.d, "q and k");
  AttentionGrads g;
  cpu::BackwardParams bp = make_params(q, k, v, dy, c, options.key_mask, g);
  const detail::AdaptedProjection adapted = detail::attention_projection(q, k, options, c.scale, w);
  detail::use_projection(adapted, w, bp.fwd);
  bp.fwd.kernel = options.kernel;
  if (context) {
    const int64_t F = feature_count(options.kernel, w.m());
    if (options.causal || !context->valid()) {
      throw Error("context: only a bidirectional forward call saves a context (this one is empty)");
    }
    if (context->states.size() != static_cast<size_t>(c.s.batch * c.s.heads * F * (c.s.dv + 1)) ||
        context->maxima.size() != static_cast<size_t>(c.s.batch * c.s.heads) ||
        context->fingerprint != (detail::context_fingerprint(k, v, w, options, c.scale) ^
                                 detail::fingerprint(adapted))) {
      throw Error(
          "context: it was saved for other k, v, W, mask or options than this backward call's");
    }
    bp.ctx_states = context->states.data();
    bp.ctx_maxima = context->maxima.data();
  }
  // FAVOR++ / FAVOR#: the kernels return dL/dW_h and dL/db_h per fit head (one sum when the
  // fit is shared), and the chain rule through the fitted transform gives dL/dW.
  std::vector<float> dw_heads, dbias;
  if (with_projection_grad && adapted.heads) {
    const int64_t m = w.m(), d = w.d();
    dw_heads.assign(static_cast<size_t>(adapted.heads * m * d), 0.0f);
    dbias.assign(static_cast<size_t>(adapted.heads * m), 0.0f);
    bp.dw = dw_heads.data();
    bp.dbias = dbias.data();
    bp.dw_head_stride = adapted.heads == 1 ? 0 : m * d;
    bp.dbias_head_stride = adapted.heads == 1 ? 0 : m;
  } else if (with_projection_grad) {
    g.dw.assign(static_cast<size_t>(w.m() * w.d()), 0.0f);
    bp.dw = g.dw.data();
  }
  if (options.causal) {
    cpu::favor_backward_causal(bp);
  } else {
    cpu::favor_backward_bidirectional(bp);
  }
  if (!dw_heads.empty()) {
    const KernelFit& fit = options.fit ? *options.fit : adapted.fitted;
    g.dw = detail::projection_grad(fit, w, dw_heads.data(), dbias.data());
  }
  return g;
}

AttentionGrads exact_attention_backward(TensorView q, TensorView k, TensorView v, TensorView dy,
                                        const ExactOptions& options) {
  const Checked c = check_backward(q, k, v, dy, options.causal, options.key_mask, options.scale);
  AttentionGrads g;
  const cpu::BackwardParams bp = make_params(q, k, v, dy, c, options.key_mask, g);
  cpu::exact_attention_backward(bp, options.causal);
  return g;
}

}  // namespace favor
