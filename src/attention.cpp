// The attention facade: validates arguments (core/validate.hpp), fills the kernel params
// and dispatches to the CPU kernels.
#include "favor/attention.hpp"

#include <algorithm>
#include <cmath>
#include <optional>

#include "core/feature_map_params.hpp"
#include "core/fingerprint.hpp"
#include "core/pages.hpp"
#include "core/params.hpp"
#include "core/validate.hpp"
#include "favor/causal_context.hpp"
#include "favor/error.hpp"
#include "favor/runtime.hpp"
#include "hybrid.hpp"
#include "kernels/backend.hpp"

namespace favor {
namespace {

static_assert(kernels::kSavedChunk == kCausalContextChunk, "the context layout is the kernels'");

kernels::AttentionParams make_params(const TensorView& q, const TensorView& k, const TensorView& v,
                                     const MutableTensorView& out, const detail::AttentionShape& s,
                                     double scale, const std::optional<KeyMaskView>& mask) {
  kernels::AttentionParams p = detail::attention_params(q, k, v, s, scale, mask);
  p.out = out.data;
  p.out_strides = out.strides;
  return p;
}

Shape4 output_shape(const detail::AttentionShape& s) {
  return {s.batch, s.heads, s.nq, s.dv};
}

// The largest row norm (norm = true) or largest |element| of head (b, h) of t, in double.
double head_max(const TensorView& t, int64_t b, int64_t h, bool norm) {
  double worst = 0.0;
  for (int64_t n = 0; n < t.shape[2]; ++n) {
    double acc = 0.0;
    for (int64_t x = 0; x < t.shape[3]; ++x) {
      const double e = t.at(b, h, n, x);
      acc = norm ? acc + e * e : std::max(acc, std::abs(e));
    }
    worst = std::max(worst, norm ? std::sqrt(acc) : acc);
  }
  return worst;
}

// True when float32 accumulation could overflow on these (finite) inputs: a scaled query
// (scale |q_i|), a logit scale q_i.k_j (at most scale |q_i| |k_j|) or a sum of at most Nk
// weighted values (weights <= 1 after the max shift: at most Nk max|v|) beyond 1e38, a
// margin below FLT_MAX = 3.4e38. float32 would then give inf, or NaN from inf - inf in the
// online softmax; double holds all of these. O((Nq + Nk) (D + Dv)) against the
// O(Nq Nk (D + Dv)) of the call.
bool f32_may_overflow(const TensorView& q, const TensorView& k, const TensorView& v, double scale) {
  constexpr double kLimit = 1e38;
  for (int64_t b = 0; b < q.shape[0]; ++b) {
    for (int64_t h = 0; h < q.shape[1]; ++h) {
      const double qn = scale * head_max(q, b, h, true);
      if (qn > kLimit || qn * head_max(k, b, h, true) > kLimit ||
          static_cast<double>(v.shape[2]) * head_max(v, b, h, false) > kLimit) {
        return true;
      }
    }
  }
  return false;
}

}  // namespace

Precision parse_precision(const std::string& name, const std::string& argument) {
  if (name == "f32") return Precision::f32;
  if (name == "bf16") return Precision::bf16;
  throw Error(argument + ": '" + name + "' must be f32 or bf16");
}

AttentionStats favor_attention(TensorView q, TensorView k, TensorView v, const FeatureMap& map,
                               MutableTensorView out, const AttentionOptions& options,
                               AttentionContext* context) {
  detail::check_map_options(options, "favor_attention");
  const auto s = detail::check_attention_inputs(q, k, v, options.causal, options.key_mask);
  detail::check_projection(map.projection, s.d, "q and k");
  detail::check_output(out, output_shape(s), "out", {q, k, v});
  detail::check_hybrid(options.window, options.sinks, s);
  const detail::ResolvedMap resolved = detail::resolve_map(map, s, q, k, options, /*borrow=*/true);
  kernels::AttentionParams p = make_params(q, k, v, out, s, resolved.scale, options.key_mask);
  p.map = resolved.params();
  if (detail::is_hybrid(options)) {
    // With save_causal_states: the estimated parts' chunk states and rows and the merge's
    // rows (hybrid_context_layout; causal or bidirectional), its buffers kept; else nothing.
    const bool save = context && options.save_causal_states;
    if (save) {
      context->fingerprint = 0;
    } else if (context) {
      *context = AttentionContext{};
    }
    AttentionStats stats;
    stats.zero_rows = detail::hybrid_forward(p, resolved, options, save ? context : nullptr);
    if (save && context->valid())
      context->fingerprint = detail::context_fingerprint(q, k, v, options) ^ resolved.fingerprint();
    return stats;
  }
  if (context) {
    // A causal context keeps its buffers (resized): a training loop that reuses it allocates
    // once. The forward overwrites every entry (each chunk's state, the final one, each row).
    const bool saves_chunks = options.causal && options.save_causal_states;
    if (saves_chunks) {
      context->fingerprint = 0;
    } else {
      *context = AttentionContext{};
    }
    const int64_t F = map.features(), heads = s.batch * s.heads;
    if (!options.causal) {
      context->states.resize(static_cast<size_t>(heads * F * (s.dv + 1)));
      context->maxima.resize(static_cast<size_t>(heads));
      p.ctx_states = context->states.data();
      p.ctx_maxima = context->maxima.data();
    } else if (saves_chunks) {  // else nothing: the state depends on the position
      const int64_t slots = causal_context_states(s.nq);
      detail::resize_populated(context->states,
                               static_cast<size_t>(heads * slots * F * (s.dv + 1)));
      detail::resize_populated(context->maxima, static_cast<size_t>(heads * slots));
      detail::resize_populated(context->rows, static_cast<size_t>(heads * s.nq * (s.dv + 1)));
      p.ctx_chunk_states = context->states.data();
      p.ctx_chunk_maxima = context->maxima.data();
      p.ctx_rows = context->rows.data();
    }
    if (context->valid())
      context->fingerprint = detail::context_fingerprint(q, k, v, options) ^ resolved.fingerprint();
  }
  AttentionStats stats;
  kernels::Backend& be = kernels::backend();
  p.bf16 = options.precision == Precision::bf16 && !options.causal && be.has_bf16();
  stats.precision = p.bf16 ? Precision::bf16 : Precision::f32;
  stats.zero_rows = options.causal ? be.favor_causal(p) : be.favor_bidirectional(p);
  return stats;
}

Tensor favor_attention(TensorView q, TensorView k, TensorView v, const FeatureMap& map,
                       const AttentionOptions& options, AttentionStats* stats) {
  Tensor out = detail::attention_output(q, v);  // the callee validates fully
  const AttentionStats st = favor_attention(q, k, v, map, out.mutable_view(), options);
  if (stats) *stats = st;
  return out;
}

AttentionStats favor_attention(TensorView q, TensorView k, TensorView v, const Projection& w,
                               MutableTensorView out, const AttentionOptions& options,
                               AttentionContext* context) {
  return favor_attention(q, k, v, detail::map_of(w, options), out, detail::without_map(options),
                         context);
}

Tensor favor_attention(TensorView q, TensorView k, TensorView v, const Projection& w,
                       const AttentionOptions& options, AttentionStats* stats) {
  return favor_attention(q, k, v, detail::map_of(w, options), detail::without_map(options), stats);
}

void exact_attention(TensorView q, TensorView k, TensorView v, MutableTensorView out,
                     const ExactOptions& options, ExactContext* context) {
  // A windowed call that saves a context scans q, k and v for finite values in its
  // fingerprint's pass over them (one read of the inputs for both).
  const bool windowed = options.window != 0 || options.sinks != 0;
  const bool saves = context && windowed;
  const auto s = saves
                     ? detail::check_input_shapes(q, k, v, options.causal, options.key_mask, false)
                     : detail::check_attention_inputs(q, k, v, options.causal, options.key_mask);
  std::optional<detail::ExactInputsFingerprint> inputs;
  if (saves) inputs.emplace(q, k, v, /*check_finite=*/true);
  detail::check_output(out, output_shape(s), "out", {q, k, v});
  const double scale = detail::resolve_scale(options.scale, s.d);
  const kernels::AttentionParams p = make_params(q, k, v, out, s, scale, options.key_mask);
  if (context) *context = ExactContext{};
  if (windowed) {
    detail::check_window_options(options, s);
    double* lse = nullptr;
    if (context) {
      context->lse.assign(static_cast<size_t>(s.batch * s.heads * s.nq), 0.0);
      lse = context->lse.data();
    }
    detail::window_forward(p, scale, options.causal, options.window, options.sinks, lse);
    if (context) context->fingerprint = inputs->finish(out, options, scale);
    return;
  }
  // Inputs whose float32 logits or sums could overflow take the double path whatever the
  // option (the f32 path would return inf or NaN for finite inputs; docs/numerics.md).
  const bool in_double =
      options.accumulation == Accumulation::f64 || f32_may_overflow(q, k, v, scale);
  kernels::backend().exact_attention(p, options.causal, in_double);
}

Tensor exact_attention(TensorView q, TensorView k, TensorView v, const ExactOptions& options) {
  Tensor out = detail::attention_output(q, v);  // the callee validates fully
  exact_attention(q, k, v, out.mutable_view(), options);
  return out;
}

}  // namespace favor
