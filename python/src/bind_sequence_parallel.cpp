// Sequence-parallel attention over a favor._core.Exchange (bind_exchange.cpp):
// sequence_parallel_attention(_map) and sequence_parallel_attention(_map)_backward, with the
// argument conventions of attention / attention_map (bind_attention.cpp, bind_feature_map.cpp)
// plus the exchange, and sequence_parallel_vq_attention(_backward) with those of vq_attention
// (bind_vq.cpp); each also returns the call's SequenceParallelStats. favor.distributed
// documents them. The GIL is released for the whole call: the exchange's Python methods take
// it back.
//
// No rank may wait forever on another because of its arguments: the C++ call starts by
// gathering every rank's error message (allgather_text). Everything this binding does before
// the call (converting q, k, v, the mask and every plain-value argument, allocating the
// output) runs inside `agreed`, whose failure (any exception) takes part in that first
// collective with its message (refuse), so every rank raises the same favor.Error naming the
// rank. The arguments other than the tensors and the exchange are therefore taken as Python
// objects and converted here (as pybind11 would convert them), not by pybind11's dispatch,
// whose TypeError would leave this rank before the agreement.
#include <pybind11/stl.h>

#include <new>
#include <optional>
#include <string>
#include <vector>

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

/// f() (the conversions and allocations before the C++ call); any error it throws is refused
/// with the other ranks. The message: a ValueError's own (favor::Error), any other error's
/// prefixed with the Python exception it would be ("TypeError: ...", "MemoryError: ..."), as
/// favor.distributed's Python layer refuses its errors.
template <class F>
auto agreed(Exchange& exchange, F&& f, bool vq = false) {
  try {
    return f();
  } catch (const py::error_already_set& e) {
    const std::string type = py::handle(e.type()).attr("__name__").cast<std::string>();
    refuse(exchange, type + ": " + py::str(e.value()).cast<std::string>(), vq);
  } catch (const std::invalid_argument& e) {
    refuse(exchange, e.what(), vq);
  } catch (const py::type_error& e) {
    refuse(exchange, std::string("TypeError: ") + e.what(), vq);
  } catch (const py::cast_error& e) {
    refuse(exchange, std::string("TypeError: ") + e.what(), vq);
  } catch (const std::bad_alloc&) {
    refuse(exchange, "MemoryError: out of memory", vq);
  } catch (const std::exception& e) {
    refuse(exchange, std::string("RuntimeError: ") + e.what(), vq);
  }
}

/// `obj` converted to T as pybind11 converts an argument (None to an empty optional); a
/// TypeError naming the argument and what it must be otherwise.
template <class T>
T argument(const py::handle& obj, const char* name, const char* expected) {
  try {
    return obj.cast<T>();
  } catch (const py::reference_cast_error&) {  // None for a reference
    throw py::type_error(std::string(name) + ": None is not " + expected);
  } catch (const py::cast_error&) {
    const std::string value = py::repr(obj).cast<std::string>().substr(0, 80);
    throw py::type_error(std::string(name) + ": " + value + " (" +
                         py::str(py::type::handle_of(obj).attr("__name__")).cast<std::string>() +
                         ") is not " + expected);
  }
}

bool flag(const py::handle& obj, const char* name) {
  return argument<bool>(obj, name, "a bool");
}

/// The options of a Projection call (kernel, causal, scale, fit) and the key mask of `c`.
AttentionOptions projection_options(const AttentionInputs& c, const py::handle& kernel,
                                    const py::handle& causal, const py::handle& scale,
                                    const py::handle& fit) {
  return attention_options(argument<std::string>(kernel, "kernel", "a str"), flag(causal, "causal"),
                           argument<std::optional<double>>(scale, "scale", "None or a float"),
                           c.mask_view(),
                           argument<std::optional<KernelFit>>(fit, "fit", "None or a KernelFit"));
}

/// The options of a FeatureMap call: causal, the key mask of `c`, the decay.
AttentionOptions feature_map_options(const AttentionInputs& c, const py::handle& causal,
                                     const py::handle& decay) {
  return map_options(flag(causal, "causal"), c,
                     argument<std::vector<double>>(decay, "decay", "a list of floats"));
}

VQCall vq_call(const py::handle& q, const py::handle& k, const py::handle& v,
               const py::handle& codebook, const py::handle& causal, const py::handle& scale,
               const py::handle& key_mask, const py::handle& tau, const py::handle& block) {
  return vq_inputs(q, k, v, codebook, flag(causal, "causal"),
                   argument<std::optional<double>>(scale, "scale", "None or a float"), key_mask,
                   argument<double>(tau, "tau", "a float"),
                   argument<int64_t>(block, "block", "an integer"));
}

/// Runs the forward call into a new output (allocated inside the agreement): (y, stats).
template <class Inputs, class Attend>
py::tuple run_forward(Exchange& exchange, const Inputs& c, bool vq, Attend&& attend) {
  const Shape4 shape = c.output_shape();
  py::array_t<float> y = agreed(
      exchange, [&] { return new_output(shape, c.q.rank); }, vq);
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
      [](const py::handle& q, const py::handle& k, const py::handle& v,
         const py::handle& projection, Exchange& exchange, const py::handle& kernel,
         const py::handle& causal, const py::handle& scale, const py::handle& key_mask,
         const py::handle& fit) {
        const AttentionInputs c =
            agreed(exchange, [&] { return attention_inputs(q, k, v, key_mask); });
        const Projection* w = agreed(exchange, [&] {
          return &argument<const Projection&>(projection, "projection", "a favor.Projection");
        });
        const AttentionOptions o =
            agreed(exchange, [&] { return projection_options(c, kernel, causal, scale, fit); });
        return run_forward(exchange, c, false, [&](MutableTensorView out) {
          return sequence_parallel_attention(c.q.view, c.k.view, c.v.view, *w, out, o, exchange);
        });
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("projection"), py::arg("exchange"),
      py::arg("kernel") = "positive", py::arg("causal") = false, py::arg("scale") = py::none(),
      py::arg("key_mask") = py::none(), py::arg("fit") = py::none());

  m.def(
      "sequence_parallel_attention_map",
      [](const py::handle& q, const py::handle& k, const py::handle& v,
         const py::handle& feature_map, Exchange& exchange, const py::handle& causal,
         const py::handle& key_mask, const py::handle& decay) {
        const AttentionInputs c =
            agreed(exchange, [&] { return attention_inputs(q, k, v, key_mask); });
        const FeatureMap* map = agreed(exchange, [&] {
          return &argument<const FeatureMap&>(feature_map, "feature_map", "a favor.FeatureMap");
        });
        const AttentionOptions o =
            agreed(exchange, [&] { return feature_map_options(c, causal, decay); });
        return run_forward(exchange, c, false, [&](MutableTensorView out) {
          return renaming_map([&] {
            return sequence_parallel_attention(c.q.view, c.k.view, c.v.view, *map, out, o,
                                               exchange);
          });
        });
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("feature_map"), py::arg("exchange"),
      py::arg("causal") = false, py::arg("key_mask") = py::none(),
      py::arg("decay") = std::vector<double>{});

  m.def(
      "sequence_parallel_attention_backward",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const py::handle& dy,
         const py::handle& projection, Exchange& exchange, const py::handle& kernel,
         const py::handle& causal, const py::handle& scale, const py::handle& key_mask,
         const py::handle& fit, const py::handle& projection_grad) {
        const AttentionInputs c =
            agreed(exchange, [&] { return attention_inputs(q, k, v, key_mask); });
        const Input g = agreed(exchange, [&] { return c.gradient(dy); });
        const Projection* w = agreed(exchange, [&] {
          return &argument<const Projection&>(projection, "projection", "a favor.Projection");
        });
        const AttentionOptions o =
            agreed(exchange, [&] { return projection_options(c, kernel, causal, scale, fit); });
        const bool want_dw =
            agreed(exchange, [&] { return flag(projection_grad, "projection_grad"); });
        AttentionGrads grads;
        SequenceParallelStats stats;
        {
          py::gil_scoped_release release;
          grads = sequence_parallel_attention_backward(c.q.view, c.k.view, c.v.view, g.view, *w, o,
                                                       exchange, want_dw, &stats);
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
         const py::handle& feature_map, Exchange& exchange, const py::handle& causal,
         const py::handle& key_mask, const py::handle& decay, const py::handle& parameter_grads) {
        const AttentionInputs c =
            agreed(exchange, [&] { return attention_inputs(q, k, v, key_mask); });
        const Input g = agreed(exchange, [&] { return c.gradient(dy); });
        const FeatureMap* map = agreed(exchange, [&] {
          return &argument<const FeatureMap&>(feature_map, "feature_map", "a favor.FeatureMap");
        });
        const AttentionOptions o =
            agreed(exchange, [&] { return feature_map_options(c, causal, decay); });
        const bool want_params =
            agreed(exchange, [&] { return flag(parameter_grads, "parameter_grads"); });
        AttentionGrads grads;
        SequenceParallelStats stats;
        {
          py::gil_scoped_release release;
          grads = renaming_map([&] {
            return sequence_parallel_attention_backward(c.q.view, c.k.view, c.v.view, g.view, *map,
                                                        o, exchange, want_params, &stats);
          });
        }
        return with_stats(map_grads_tuple(std::move(grads), *map, c.q.rank), stats);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("dy"), py::arg("feature_map"),
      py::arg("exchange"), py::arg("causal") = false, py::arg("key_mask") = py::none(),
      py::arg("decay") = std::vector<double>{}, py::arg("parameter_grads") = false);

  m.def(
      "sequence_parallel_vq_attention",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const py::handle& codebook,
         Exchange& exchange, const py::handle& causal, const py::handle& scale,
         const py::handle& key_mask, const py::handle& tau, const py::handle& block) {
        const VQCall c = agreed(
            exchange,
            [&] { return vq_call(q, k, v, codebook, causal, scale, key_mask, tau, block); }, kVQ);
        return run_forward(exchange, c, kVQ, [&](MutableTensorView out) {
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
         const py::handle& codebook, Exchange& exchange, const py::handle& causal,
         const py::handle& scale, const py::handle& key_mask, const py::handle& tau,
         const py::handle& block, const py::handle& codebook_grad) {
        const VQCall c = agreed(
            exchange,
            [&] { return vq_call(q, k, v, codebook, causal, scale, key_mask, tau, block); }, kVQ);
        const Input g = agreed(
            exchange, [&] { return c.gradient(dy); }, kVQ);
        const bool want_dc = agreed(
            exchange, [&] { return flag(codebook_grad, "codebook_grad"); }, kVQ);
        VQGrads grads;
        SequenceParallelStats stats;
        {
          py::gil_scoped_release release;
          grads = sequence_parallel_vq_attention_backward(c.q.view, c.k.view, c.v.view, g.view,
                                                          c.codebook.view, c.options, exchange,
                                                          want_dc, &stats);
        }
        return with_stats(c.grads_tuple(std::move(grads), want_dc), stats);
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
