#pragma once
// What the attention bindings (bind_attention.cpp with a projection, bind_feature_map.cpp
// with a FeatureMap, bind_sequence_parallel.cpp) share: q, k, v and the key mask checked and
// converted, dy checked against them, the forward call run into a new output with its
// optional saved context, and the gradients returned as numpy arrays.
#include <cstring>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "options.hpp"

namespace favor::python {

/// The inputs of an attention call: q, k, v of one rank and the key mask [B, Nk] (or [Nk]).
struct AttentionInputs {
  Input q, k, v;
  std::optional<Mask> mask;

  std::optional<KeyMaskView> mask_view() const { return python::mask_view(mask); }
  /// The output's shape [B, H, Nq, Dv].
  Shape4 output_shape() const {
    return {q.view.shape[0], q.view.shape[1], q.view.shape[2], v.view.shape[3]};
  }
  /// The output gradient dy of a backward call, of q's rank.
  Input gradient(const py::handle& dy, const char* name = "dy") const {
    Input g = as_input(dy, name);
    check_same_rank({&q, &g}, std::string("q, ") + name);
    return g;
  }
};

inline AttentionInputs attention_inputs(const py::handle& q, const py::handle& k,
                                        const py::handle& v, const py::handle& key_mask) {
  AttentionInputs c{as_input(q, "q"), as_input(k, "k"), as_input(v, "v"), std::nullopt};
  check_same_rank({&c.q, &c.k, &c.v}, "q, k, v");
  c.mask = as_mask(key_mask, c.k.rank, c.k.view.shape[0], c.k.view.shape[2], "key_mask");
  return c;
}

/// A context borrowed from the caller's arrays (favor._core.AttentionContextView: the tensors
/// favor.torch's op kept between forward and backward), which it keeps alive.
struct BorrowedContext {
  py::array_t<float> states, rows;
  py::array_t<double> maxima;
  AttentionContextView view;
};

/// The view of a backward call's `context` argument: None, an AttentionContext (a forward's)
/// or an AttentionContextView (BorrowedContext); else favor::Error naming it.
inline std::optional<AttentionContextView> context_view(const py::handle& context) {
  if (context.is_none()) return std::nullopt;
  if (py::isinstance<AttentionContext>(context))
    return context.cast<const AttentionContext&>().view();
  if (py::isinstance<BorrowedContext>(context)) return context.cast<const BorrowedContext&>().view;
  throw Error("context: must be None, an AttentionContext or an AttentionContextView");
}

/// Runs attend(out, context) with the GIL released, writing a new output of q's rank; the
/// context is where to save the forward state (null unless save_context). Returns the tuple
/// (y, zero_rows, the saved AttentionContext or None) of favor._core.attention(_map).
template <class Attend>
py::tuple run_attention(const AttentionInputs& c, bool save_context, Attend&& attend) {
  const Shape4 shape = c.output_shape();
  py::array_t<float> y = new_output(shape, c.q.rank);
  const MutableTensorView out = output_view(y, shape);
  auto context = std::make_unique<AttentionContext>();
  AttentionStats stats;
  {
    py::gil_scoped_release release;
    stats = attend(out, save_context ? context.get() : nullptr);
  }
  py::object ctx = py::none();
  if (save_context && context->valid()) ctx = py::cast(std::move(context));
  return py::make_tuple(y, stats.zero_rows, ctx);
}

/// The options of a FeatureMap call: causal, the key mask of `c`, the decay.
inline AttentionOptions map_options(bool causal, const AttentionInputs& c,
                                    std::vector<double> decay) {
  AttentionOptions o;
  o.causal = causal;
  o.key_mask = c.mask_view();
  o.decay = std::move(decay);
  return o;
}

/// Runs `f`, renaming the C++ argument "map" in its errors (renamed_map_error).
template <class F>
auto renaming_map(F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    throw renamed_map_error(e);
  }
}

/// (dq, dk, dv, dw or None) of a Projection call, in the inputs' rank.
inline py::tuple grads_tuple(AttentionGrads&& g, int rank) {
  py::object dw = py::none();
  if (!g.dw.empty()) {
    const int64_t d = g.dq.shape()[3];
    const auto m = static_cast<py::ssize_t>(g.dw.size()) / d;
    dw = to_array(std::move(g.dw), {m, d});
  }
  return py::make_tuple(to_array(std::move(g.dq), rank), to_array(std::move(g.dk), rank),
                        to_array(std::move(g.dv), rank), dw);
}

/// (dq, dk, dv, dw, dbias, dlambda, ddecay) of a FeatureMap call, None for the parameter
/// gradients not computed: dw [heads, m, D] with per-head weights, else [m, D].
inline py::tuple map_grads_tuple(AttentionGrads&& g, const FeatureMap& map, int rank) {
  const auto or_none = [](std::vector<float>&& v, std::vector<py::ssize_t> shape) -> py::object {
    if (v.empty()) return py::none();
    return to_array(std::move(v), std::move(shape));
  };
  const int64_t m = map.m(), d = map.d(), sets = map.heads;
  std::vector<py::ssize_t> dw_shape{m, d};
  if (!map.weights.empty()) dw_shape = {sets, m, d};
  py::object ddecay = py::none();
  if (!g.ddecay.empty()) {
    py::array_t<double> a(static_cast<py::ssize_t>(g.ddecay.size()));
    std::memcpy(a.mutable_data(), g.ddecay.data(), sizeof(double) * g.ddecay.size());
    ddecay = std::move(a);
  }
  return py::make_tuple(to_array(std::move(g.dq), rank), to_array(std::move(g.dk), rank),
                        to_array(std::move(g.dv), rank), or_none(std::move(g.dw), dw_shape),
                        or_none(std::move(g.dbias), {sets, m}),
                        or_none(std::move(g.dlambda), {sets, m}), ddecay);
}

}  // namespace favor::python
