#pragma once
// What the attention bindings (bind_attention.cpp with a projection, bind_feature_map.cpp
// with a FeatureMap) share: q, k, v and the key mask checked and converted, dy checked
// against them, and the forward call run into a new output with its optional saved context.
#include <memory>
#include <optional>
#include <utility>

#include "arrays.hpp"

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
  Input gradient(const py::handle& dy) const {
    Input g = as_input(dy, "dy");
    check_same_rank({&q, &g}, "q, dy");
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

}  // namespace favor::python
