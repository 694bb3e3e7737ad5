// Sequence-parallel attention over a favor._core.Exchange (bind_exchange.cpp):
// sequence_parallel_attention(_map) and sequence_parallel_attention(_map)_backward, with the
// argument conventions of attention / attention_map (bind_attention.cpp, bind_feature_map.cpp)
// plus the exchange, and sequence_parallel_vq_attention(_backward) with those of vq_attention
// (bind_vq.cpp); each also returns the call's SequenceParallelStats. favor.distributed
// documents them. The GIL is released for the whole call: the exchange's Python methods take
// it back.
//
// No rank may wait forever on another: the C++ call starts by gathering every rank's error
// message (allgather_text), so a rank whose arguments this layer refuses before the call
// (a wrong rank, dtype or mask shape) takes part in that first collective with its message
// (refuse) and every rank raises the same favor.Error.
#include <pybind11/stl.h>

#include "arrays.hpp"
#include "attention_call.hpp"
#include "bindings.hpp"
#include "options.hpp"
#include "vq_call.hpp"

namespace favor::python {
namespace {

constexpr bool kVQ = true;  // the VQ call's errors (agreed's and refuse's last argument)

/// The C++ call's agreement on errors, joined by a rank that fails before the call while the
/// others are in it (favor::refuse_sequence_parallel).
[[noreturn]] void refuse(Exchange& exchange, const std::string& error, bool vq) {
  refuse_sequence_parallel(exchange, error, vq);
}

/// f() (the checks and conversions before the C++ call); its error is refused with the
/// other ranks.
template <class F>
auto agreed(Exchange& exchange, F&& f, bool vq = false) {
  try {
    return f();
  } catch (const std::exception& e) {
    refuse(exchange, e.what(), vq);
  }
}

/// Runs the forward call into a new output: (y, stats).
template <class Inputs, class Attend>
py::tuple run_forward(const Inputs& c, Attend&& attend) {
  const Shape4 shape = c.output_shape();
  py::array_t<float> y = new_output(shape, c.q.rank);
  const MutableTensorView out = output_view(y, shape);
  SequenceParallelStats stats;
  {
    py::gil_scoped_release release;
    stats = attend(out);
  }
  return py::make_tuple(y, stats);
}

/// `grads` with the stats appended.
py::tuple with_stats(const py::tuple& grads, const SequenceParallelStats& stats) {
  py::list all(grads);
  all.append(py::cast(stats));
  return py::tuple(all);
}

}  // namespace

void bind_sequence_parallel(py::module_& m) {
  m.def(
      "sequence_parallel_attention",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const Projection& w,
         Exchange& exchange, const std::string& kernel, bool causal, std::optional<double> scale,
         const py::handle& key_mask, const std::optional<KernelFit>& fit) {
        const AttentionInputs c =
            agreed(exchange, [&] { return attention_inputs(q, k, v, key_mask); });
        const AttentionOptions o = agreed(
            exchange, [&] { return attention_options(kernel, causal, scale, c.mask_view(), fit); });
        return run_forward(c, [&](MutableTensorView out) {
          return sequence_parallel_attention(c.q.view, c.k.view, c.v.view, w, out, o, exchange);
        });
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("projection"), py::arg("exchange"),
      py::arg("kernel") = "positive", py::arg("causal") = false, py::arg("scale") = py::none(),
      py::arg("key_mask") = py::none(), py::arg("fit") = py::none());

  m.def(
      "sequence_parallel_attention_map",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const FeatureMap& map,
         Exchange& exchange, bool causal, const py::handle& key_mask, std::vector<double> decay) {
        const AttentionInputs c =
            agreed(exchange, [&] { return attention_inputs(q, k, v, key_mask); });
        const AttentionOptions o = map_options(causal, c, std::move(decay));
        return run_forward(c, [&](MutableTensorView out) {
          return renaming_map([&] {
            return sequence_parallel_attention(c.q.view, c.k.view, c.v.view, map, out, o, exchange);
          });
        });
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("feature_map"), py::arg("exchange"),
      py::arg("causal") = false, py::arg("key_mask") = py::none(),
      py::arg("decay") = std::vector<double>{});

  m.def(
      "sequence_parallel_attention_backward",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const py::handle& dy,
         const Projection& w, Exchange& exchange, const std::string& kernel, bool causal,
         std::optional<double> scale, const py::handle& key_mask,
         const std::optional<KernelFit>& fit, bool projection_grad) {
        const AttentionInputs c =
            agreed(exchange, [&] { return attention_inputs(q, k, v, key_mask); });
        const Input g = agreed(exchange, [&] { return c.gradient(dy); });
        const AttentionOptions o = agreed(
            exchange, [&] { return attention_options(kernel, causal, scale, c.mask_view(), fit); });
        AttentionGrads grads;
        SequenceParallelStats stats;
        {
          py::gil_scoped_release release;
          grads = sequence_parallel_attention_backward(c.q.view, c.k.view, c.v.view, g.view, w, o,
                                                       exchange, projection_grad, &stats);
        }
        return with_stats(grads_tuple(std::move(grads), c.q.rank), stats);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("dy"), py::arg("projection"),
      py::arg("exchange"), py::arg("kernel") = "positive", py::arg("causal") = false,
      py::arg("scale") = py::none(), py::arg("key_mask") = py::none(), py::arg("fit") = py::none(),
      py::arg("projection_grad") = false);

  m.def(
      "sequence_parallel_attention_map_backward",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const py::handle& dy,
         const FeatureMap& map, Exchange& exchange, bool causal, const py::handle& key_mask,
         std::vector<double> decay, bool parameter_grads) {
        const AttentionInputs c =
            agreed(exchange, [&] { return attention_inputs(q, k, v, key_mask); });
        const Input g = agreed(exchange, [&] { return c.gradient(dy); });
        const AttentionOptions o = map_options(causal, c, std::move(decay));
        AttentionGrads grads;
        SequenceParallelStats stats;
        {
          py::gil_scoped_release release;
          grads = renaming_map([&] {
            return sequence_parallel_attention_backward(c.q.view, c.k.view, c.v.view, g.view, map,
                                                        o, exchange, parameter_grads, &stats);
          });
        }
        return with_stats(map_grads_tuple(std::move(grads), map, c.q.rank), stats);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("dy"), py::arg("feature_map"),
      py::arg("exchange"), py::arg("causal") = false, py::arg("key_mask") = py::none(),
      py::arg("decay") = std::vector<double>{}, py::arg("parameter_grads") = false);

  m.def(
      "sequence_parallel_vq_attention",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const py::handle& codebook,
         Exchange& exchange, bool causal, std::optional<double> scale, const py::handle& key_mask,
         double tau, int64_t block) {
        const VQCall c = agreed(
            exchange,
            [&] { return vq_inputs(q, k, v, codebook, causal, scale, key_mask, tau, block); }, kVQ);
        return run_forward(c, [&](MutableTensorView out) {
          return sequence_parallel_vq_attention(c.q.view, c.k.view, c.v.view, c.codebook.view, out,
                                                c.options, exchange);
        });
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("codebook"), py::arg("exchange"),
      py::arg("causal") = false, py::arg("scale") = py::none(), py::arg("key_mask") = py::none(),
      py::arg("tau") = 0.0, py::arg("block") = 0);

  m.def(
      "sequence_parallel_vq_attention_backward",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const py::handle& dy,
         const py::handle& codebook, Exchange& exchange, bool causal, std::optional<double> scale,
         const py::handle& key_mask, double tau, int64_t block, bool codebook_grad) {
        const VQCall c = agreed(
            exchange,
            [&] { return vq_inputs(q, k, v, codebook, causal, scale, key_mask, tau, block); }, kVQ);
        const Input g = agreed(
            exchange, [&] { return c.gradient(dy); }, kVQ);
        VQGrads grads;
        SequenceParallelStats stats;
        {
          py::gil_scoped_release release;
          grads = sequence_parallel_vq_attention_backward(c.q.view, c.k.view, c.v.view, g.view,
                                                          c.codebook.view, c.options, exchange,
                                                          codebook_grad, &stats);
        }
        return with_stats(c.grads_tuple(std::move(grads), codebook_grad), stats);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("dy"), py::arg("codebook"),
      py::arg("exchange"), py::arg("causal") = false, py::arg("scale") = py::none(),
      py::arg("key_mask") = py::none(), py::arg("tau") = 0.0, py::arg("block") = 0,
      py::arg("codebook_grad") = false);

  m.def(
      "sequence_parallel_refuse",
      [](Exchange& exchange, const std::string& error, bool vq) { refuse(exchange, error, vq); },
      py::arg("exchange"), py::arg("error"), py::arg("vq") = false,
      "Takes part in a sequence-parallel call's agreement on errors with `error` (the "
      "other ranks are in the call: sequence_parallel_attention(_map)(_backward), or with "
      "vq=True sequence_parallel_vq_attention(_backward)) and raises the error every rank "
      "raises.");
}

}  // namespace favor::python
