// Sequence-parallel FAVOR attention (favor/sequence_parallel.hpp): each rank validates its
// slice, the ranks agree (error messages, then a fingerprint of shapes, options and map), a
// FAVOR++ / FAVOR# fit comes from moments summed over ranks, and the per-head key states
// cross once (bidirectional: allreduce; causal: exclusive scan). The backward pass adds the
// query-side sums R (bidirectional: allreduce; causal: reverse exclusive scan).
#include "favor/sequence_parallel.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <new>
#include <optional>

#include "core/agreement.hpp"
#include "core/feature_map_params.hpp"
#include "core/parameter_grads.hpp"
#include "core/params.hpp"
#include "core/validate.hpp"
#include "favor/error.hpp"
#include "kernels/backend.hpp"

namespace favor {
namespace {

constexpr double kEmpty = -std::numeric_limits<double>::infinity();

constexpr const char* kWhat = "sequence-parallel attention";
constexpr const char* kRule = "every rank must call with the same shapes (but N), options and map";

// What every rank must agree on, in this order (the names for the message).
const std::vector<detail::AgreedField> kAgreed = {
    {"batch B", true},
    {"heads H", true},
    {"head dim D", true},
    {"value dim Dv", true},
    {"causal flag", false},
    {"kernel", false},
    {"features F", true},
    {"key mask presence", false},
    {"scale", false},
    {"feature map (projection, learned parameters, fit)", false},
    {"decay", false},
    {"parameter gradients", false},
    {"call (forward or backward)", false}};

// One rank's validated call.
struct Call {
  detail::AttentionShape s{};
  FeatureMap map;
  detail::ResolvedMap resolved;
  bool fit_over_ranks = false;  // FAVOR++ / FAVOR# fitted to the moments of every rank
  explicit Call(const FeatureMap& m) : map(m) {}
};

// Validates this rank's inputs and resolves the map (a FAVOR++ / FAVOR# map without a fit
// with a stand-in fit: the real one needs the other ranks).
Call validate(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView* dy,
              const FeatureMap& map, const AttentionOptions& options, const char* function) {
  detail::check_map_options(options, function);
  if (options.window != 0 || options.sinks != 0) {
    throw Error(std::string("window, sinks: ") + function +
                " does not take hybrid attention (each rank's window would need its "
                "neighbour's keys); run favor_attention");
  }
  Call c(map);
  c.s = detail::check_slice_inputs(q, k, v, options.causal, options.key_mask);
  if (dy) {
    detail::check_view(*dy, "dy", true);
    const Shape4 expected{c.s.batch, c.s.heads, c.s.nq, c.s.dv};
    if (dy->shape != expected) {
      throw Error("dy: shape " + shape_string(dy->shape) +
                  " must be the output's shape [B, H, Nq, Dv] = " + shape_string(expected));
    }
    detail::check_finite(*dy, "dy");
  }
  detail::check_projection(map.projection, c.s.d, "q and k");
  if (data_adapted(map.kernel) && !map.fit) {
    if (options.causal) {
      throw Error("fit: causal " + to_string(map.kernel) +
                  " attention needs a fit (from calibration data, fit_kernel, or "
                  "KernelFit::constant): a fit to the sequence would let every position see "
                  "statistics of future tokens");
    }
    c.fit_over_ranks = true;
    c.map.fit = KernelFit::constant(0.0, c.s.d);  // validates the rest; replaced later
  }
  c.resolved = detail::resolve_map(c.map, c.s, q, k, options);
  return c;
}

std::vector<int64_t> call_fields(const Call& c, const AttentionOptions& options, bool grads,
                                 bool backward) {
  uint64_t map_hash = c.fit_over_ranks ? 1 : 0;
  map_hash ^= c.resolved.fingerprint();
  return {c.s.batch,
          c.s.heads,
          c.s.d,
          c.s.dv,
          options.causal ? 1 : 0,
          static_cast<int64_t>(c.map.kernel),
          c.map.features(),
          options.key_mask ? 1 : 0,
          static_cast<int64_t>(detail::bits_of(c.resolved.scale)),
          static_cast<int64_t>(map_hash),
          static_cast<int64_t>(detail::hash_doubles(options.decay)),
          grads ? 1 : 0,
          backward ? 1 : 0,
          c.s.nq,
          c.s.nk};
}

// The fit of the whole sequence: moments summed over ranks.
void fit_over_ranks(Call& c, const TensorView& q, const TensorView& k,
                    const AttentionOptions& options, Exchange& ex, SequenceParallelStats& st) {
  if (!c.fit_over_ranks) return;
  KernelMoments mo = kernel_moments(c.map.kernel, q, k, c.map.scale, options.key_mask);
  ex.allreduce_sum(mo.sums.data(), static_cast<int64_t>(mo.sums.size()));
  ++st.collectives;
  st.payload_bytes += static_cast<int64_t>(mo.sums.size() * sizeof(double));
  c.map.fit = fit_from_moments(mo);
  c.resolved = detail::resolve_map(c.map, c.s, q, k, options);
}

// Validation, agreement and the fit: what forward and backward calls share. reserve (optional)
// allocates the call's large buffers before the agreement, so that an allocation failure is
// agreed like a broken rule instead of leaving the other ranks waiting in a collective.
Call prepare(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView* dy,
             const MutableTensorView* out, const FeatureMap& map, const AttentionOptions& options,
             bool grads, Exchange& ex, const char* function, SequenceParallelStats& st,
             const std::function<void(const Call&)>& reserve = {}) {
  std::string error;
  std::optional<Call> call;
  try {
    call.emplace(validate(q, k, v, dy, map, options, function));
    if (out) {
      const Shape4 expected{call->s.batch, call->s.heads, call->s.nq, call->s.dv};
      if (call->s.nq > 0) {
        detail::check_output(*out, expected, "out", {q, k, v});
      } else if (out->shape != expected) {
        throw Error("out: shape " + shape_string(out->shape) + " must be " +
                    shape_string(expected));
      }
    }
    if (reserve) reserve(*call);
  } catch (const std::bad_alloc&) {
    error = "out of memory for this rank's slice";
  } catch (const std::exception& e) {
    error = e.what();
    if (error.empty()) error = "invalid input";
  }
  detail::agree_on_errors(ex, error, kWhat, st);
  Call& c = *call;
  const std::vector<int64_t> lengths = detail::agree_on_fields(
      ex, call_fields(c, options, grads, dy != nullptr), kAgreed, kWhat, kRule, st);
  detail::slice_positions(lengths, ex.rank(), options.causal, kWhat, st);
  fit_over_ranks(c, q, k, options, ex, st);
  return std::move(c);
}

kernels::AttentionParams kernel_params(const TensorView& q, const TensorView& k,
                                       const TensorView& v, const Call& c,
                                       const AttentionOptions& options, int64_t offset) {
  kernels::AttentionParams p =
      detail::attention_params(q, k, v, c.s, c.resolved.scale, options.key_mask);
  p.map = c.resolved.params();
  p.first_position = offset;  // decay weights keys by their position in the whole sequence
  return p;
}

// Flat per-head states (what the kernels read) and the block that crosses between ranks.
struct States {
  int64_t heads, size;
  std::vector<float> values, distance;
  std::vector<double> maxima;
  States(int64_t heads_, int64_t size_, bool with_distance)
      : heads(heads_),
        size(size_),
        values(static_cast<size_t>(heads_ * size_), 0.0f),
        distance(with_distance ? static_cast<size_t>(heads_ * size_) : 0, 0.0f),
        maxima(static_cast<size_t>(heads_), kEmpty) {}

  StateBlock block(double length) const {
    StateBlock b(heads, size, !distance.empty());
    for (int64_t h = 0; h < heads; ++h) {
      b.header(h).max = maxima[h];
      b.header(h).length = length;
      std::copy_n(values.data() + h * size, size, b.state(h));
      if (!distance.empty()) std::copy_n(distance.data() + h * size, size, b.distance_state(h));
    }
    return b;
  }
  void load(const StateBlock& b) {
    for (int64_t h = 0; h < heads; ++h) {
      maxima[h] = b.header(h).max;
      std::copy_n(b.state(h), size, values.data() + h * size);
      if (!distance.empty()) std::copy_n(b.distance_state(h), size, distance.data() + h * size);
    }
  }
};

// This rank's key states, combined over ranks: bidirectional, the total (allreduce); causal,
// the prefix of the earlier ranks (exclusive scan). Points p at them.
States key_states_over_ranks(kernels::AttentionParams& p, const Call& c,
                             const AttentionOptions& options, bool distance, Exchange& ex,
                             SequenceParallelStats& st) {
  const int64_t F = c.map.features();
  States states(c.s.batch * c.s.heads, F * (c.s.dv + 1), distance);
  // A causal scan never reads the last rank's own state: it skips its key pass.
  const bool unread = options.causal && ex.rank() == ex.size() - 1;
  if (c.s.nk > 0 && !unread) {
    kernels::backend().favor_key_states(p, states.values.data(), states.maxima.data(),
                                        distance ? states.distance.data() : nullptr);
  }
  StateBlock block = states.block(static_cast<double>(c.s.nk));
  if (options.causal) {
    ex.exscan_states(block, false);
  } else {
    ex.allreduce_states(block);
  }
  ++st.collectives;
  st.payload_bytes += block.bytes();
  states.load(block);
  p.init_states = states.values.data();
  p.init_maxima = states.maxima.data();
  if (distance) p.init_distance = states.distance.data();
  return states;
}

}  // namespace

SequenceParallelStats sequence_parallel_attention(TensorView q, TensorView k, TensorView v,
                                                  const FeatureMap& map, MutableTensorView out,
                                                  const AttentionOptions& options,
                                                  Exchange& exchange) {
  SequenceParallelStats st;
  Call c = prepare(q, k, v, nullptr, &out, map, options, false, exchange,
                   "sequence_parallel_attention", st);
  kernels::AttentionParams p = kernel_params(q, k, v, c, options, st.offset);
  p.out = out.data;
  p.out_strides = out.strides;
  const States states = key_states_over_ranks(p, c, options, false, exchange, st);
  if (c.s.nq > 0)
    st.zero_rows = options.causal ? kernels::backend().favor_causal(p)
                                  : kernels::backend().favor_bidirectional(p);
  return st;
}

SequenceParallelStats sequence_parallel_attention(TensorView q, TensorView k, TensorView v,
                                                  const Projection& w, MutableTensorView out,
                                                  const AttentionOptions& options,
                                                  Exchange& exchange) {
  return sequence_parallel_attention(q, k, v, detail::map_of(w, options), out,
                                     detail::without_map(options), exchange);
}

AttentionGrads sequence_parallel_attention_backward(TensorView q, TensorView k, TensorView v,
                                                    TensorView dy, const FeatureMap& map,
                                                    const AttentionOptions& options,
                                                    Exchange& exchange, bool with_parameter_grads,
                                                    SequenceParallelStats* stats) {
  SequenceParallelStats st;
  AttentionGrads g;
  std::unique_ptr<kernels::CausalBackwardSplit> split;
  const auto reserve = [&](const Call& c) {  // dq, dk, dv and the causal sweeps' buffers
    g.dq = Tensor({c.s.batch, c.s.heads, c.s.nq, c.s.d});
    g.dk = Tensor({c.s.batch, c.s.heads, c.s.nk, c.s.d});
    g.dv = Tensor({c.s.batch, c.s.heads, c.s.nk, c.s.dv});
    if (options.causal) {
      split = kernels::backend().favor_backward_causal_split(c.s.batch * c.s.heads, c.s.nq,
                                                             c.map.features(), c.s.dv);
    }
  };
  Call c = prepare(q, k, v, &dy, nullptr, map, options, with_parameter_grads, exchange,
                   "sequence_parallel_attention_backward", st, reserve);
  const int64_t heads = c.s.batch * c.s.heads, F = c.map.features(), ld = c.s.dv + 1;
  kernels::BackwardParams bp{};
  bp.fwd = kernel_params(q, k, v, c, options, st.offset);
  bp.dy = dy.data;
  bp.dy_strides = dy.strides;
  bp.dq = g.dq.data();
  bp.dk = g.dk.data();
  bp.dv = g.dv.data();
  detail::ParameterGrads pg(c.resolved, c.map, c.s, with_parameter_grads, bp);
  const bool distance = options.causal && bp.drate != nullptr;
  const States states = key_states_over_ranks(bp.fwd, c, options, distance, exchange, st);
  if (!options.causal) {
    // Queries (dq, and R), R summed over ranks, then keys (dk, dv).
    std::vector<float> r(static_cast<size_t>(heads * F * ld), 0.0f);
    bp.ctx_states = states.values.data();
    bp.ctx_maxima = states.maxima.data();
    bp.fwd.init_states = nullptr;
    bp.r_out = r.data();
    if (c.s.nq > 0) kernels::backend().favor_backward_bidirectional(bp);
    exchange.allreduce_sum(r.data(), static_cast<int64_t>(r.size()));
    ++st.collectives;
    st.payload_bytes += static_cast<int64_t>(r.size() * sizeof(float));
    bp.r_out = nullptr;
    bp.r_in = r.data();
    if (c.s.nk > 0) kernels::backend().favor_backward_bidirectional(bp);
  } else {
    // Forward sweep (dq, and the slice's R), R summed over the later ranks, reverse sweep.
    split->phase_a(bp);
    States suffix(heads, F * ld, false);
    for (int64_t h = 0; h < heads; ++h) {      // R's reference is its starting max: negated, so
      const double start = split->r_max()[h];  // that the later ranks' smaller one wins
      suffix.maxima[h] = std::isinf(start) ? kEmpty : -start;
    }
    suffix.values = split->r();
    StateBlock block = suffix.block(0.0);
    exchange.exscan_states(block, true);
    ++st.collectives;
    st.payload_bytes += block.bytes();
    suffix.load(block);
    std::vector<double> ref(static_cast<size_t>(heads));
    for (int64_t h = 0; h < heads; ++h) {
      ref[h] = std::isinf(suffix.maxima[h]) ? kEmpty : -suffix.maxima[h];
    }
    split->phase_b(bp, suffix.values.data(), ref.data());
  }
  pg.finish(c.map, g);
  if (stats) *stats = st;
  return g;
}

AttentionGrads sequence_parallel_attention_backward(TensorView q, TensorView k, TensorView v,
                                                    TensorView dy, const Projection& w,
                                                    const AttentionOptions& options,
                                                    Exchange& exchange, bool with_projection_grad,
                                                    SequenceParallelStats* stats) {
  return sequence_parallel_attention_backward(q, k, v, dy, detail::map_of(w, options),
                                              detail::without_map(options), exchange,
                                              with_projection_grad, stats);
}

void refuse_sequence_parallel(Exchange& exchange, const std::string& message, bool vq) {
  SequenceParallelStats st;
  detail::agree_on_errors(exchange, message.empty() ? "invalid input" : message,
                          vq ? "sequence-parallel VQ attention" : kWhat, st);
  throw Error("refuse_sequence_parallel: the agreement on errors did not see this rank's");
}

}  // namespace favor
