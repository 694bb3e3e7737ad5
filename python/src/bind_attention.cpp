// favor.attention, attention_backward, exact_attention(_backward), features, metrics.
#include <pybind11/stl.h>

#include "arrays.hpp"
#include "attention_call.hpp"
#include "bindings.hpp"
#include "favor/causal_context.hpp"
#include "options.hpp"

namespace favor::python {
namespace {

ExactOptions exact_options(bool causal, std::optional<double> scale, const AttentionInputs& c,
                           const std::string& accumulate) {
  if (accumulate != "f32" && accumulate != "f64") {
    throw Error("accumulate: '" + accumulate + "' must be f32 or f64");
  }
  ExactOptions o;
  o.causal = causal;
  o.scale = scale;
  o.key_mask = c.mask_view();
  o.accumulation = accumulate == "f64" ? Accumulation::f64 : Accumulation::f32;
  return o;
}

/// A [N, D] array (or [1, 1, N, D]) for the metrics that take rows.
TensorView rows(const Input& in, const std::string& name) {
  if (in.view.shape[0] != 1 || in.view.shape[1] != 1) {
    throw Error(name + ": shape " + shape_string(in.view.shape) + " must be [N, D]");
  }
  return in.view;
}

/// A context's array as a 1-D numpy view that keeps the context (`self`) alive: no copy.
template <class Context, class T>
py::array_t<T> view_of(const py::object& self, std::vector<T> Context::* member) {
  const std::vector<T>& values = self.cast<const Context&>().*member;
  return py::array_t<T>(static_cast<py::ssize_t>(values.size()), values.data(), self);
}

}  // namespace

void bind_attention(py::module_& m) {
  // The saved key state of a bidirectional forward (or, save_causal_states, the chunk states
  // and rows of a causal one). Its arrays can be taken out and put back (favor.torch's custom
  // ops carry it between forward and backward as tensors): states [B*H * F * (Dv + 1)]
  // float32 (causal: [B*H * causal_context_states(N) * F * (Dv + 1)]), maxima [B*H] float64
  // (causal: [B*H * causal_context_states(N)]), rows (causal: [B*H * N * (Dv + 1)]) and the
  // fingerprint of the inputs and options it belongs to (the backward refuses a context of
  // other inputs).
  m.def("causal_context_states", &causal_context_states, py::arg("n"),
        "Chunk states a causal context saves over n tokens (AttentionOptions::save_causal_states)");
  m.attr("causal_context_chunk") = kCausalContextChunk;
  m.def(
      "hybrid_context_sizes",
      [](int64_t heads, int64_t n, int64_t features, int64_t dv, int64_t window, bool causal) {
        const HybridContextLayout l = hybrid_context_layout(heads, n, features, dv, window, causal);
        return py::make_tuple(l.states, l.maxima, l.rows);
      },
      py::arg("heads"), py::arg("n"), py::arg("features"), py::arg("dv"), py::arg("window"),
      py::arg("causal"),
      "Sizes (states, maxima, rows) of the context a hybrid call saves with "
      "save_causal_states (favor/causal_context.hpp, hybrid_context_layout)");
  py::class_<AttentionContext>(m, "AttentionContext")
      .def_property_readonly("valid", &AttentionContext::valid)
      .def_property_readonly("nbytes",
                             [](const AttentionContext& c) {
                               return (c.states.size() + c.rows.size()) * sizeof(float) +
                                      c.maxima.size() * sizeof(double);
                             })
      // the arrays without a copy: views of the context's memory, which they keep alive
      .def_property_readonly(
          "states", [](py::object self) { return view_of(self, &AttentionContext::states); })
      .def_property_readonly(
          "maxima", [](py::object self) { return view_of(self, &AttentionContext::maxima); })
      .def_property_readonly("rows",
                             [](py::object self) { return view_of(self, &AttentionContext::rows); })
      .def_readonly("fingerprint", &AttentionContext::fingerprint);
  // A context's arrays borrowed (no copy: float32 / float64 C-contiguous arrays are kept as they
  // are and alive while the view lives); sizes are checked by the backward that reads them.
  py::class_<BorrowedContext>(m, "AttentionContextView")
      .def_property_readonly("valid", [](const BorrowedContext& c) { return c.view.valid(); })
      .def_static(
          "from_arrays",
          [](const py::handle& states, const py::handle& maxima, uint64_t fingerprint,
             const py::handle& rows) {
            BorrowedContext c;
            c.states =
                py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(states);
            c.maxima =
                py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(maxima);
            if (!c.states || c.states.ndim() != 1 || c.states.size() == 0) {
              throw Error("states: must be a non-empty 1-D float array");
            }
            if (!c.maxima || c.maxima.ndim() != 1 || c.maxima.size() == 0) {
              throw Error("maxima: must be a non-empty 1-D float array");
            }
            c.view.states = c.states.data();
            c.view.states_size = static_cast<size_t>(c.states.size());
            c.view.maxima = c.maxima.data();
            c.view.maxima_size = static_cast<size_t>(c.maxima.size());
            c.view.fingerprint = fingerprint;
            if (!rows.is_none()) {
              c.rows = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(rows);
              if (!c.rows || c.rows.ndim() != 1) throw Error("rows: must be a 1-D float array");
              c.view.rows = c.rows.data();
              c.view.rows_size = static_cast<size_t>(c.rows.size());
            }
            return c;
          },
          py::arg("states"), py::arg("maxima"), py::arg("fingerprint"),
          py::arg("rows") = py::none());

  m.def(
      "attention",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const Projection& w,
         const std::string& kernel, bool causal, std::optional<double> scale,
         const py::handle& key_mask, const std::optional<KernelFit>& fit, bool save_context,
         const std::string& precision, bool save_causal_states, int64_t window, int64_t sinks) {
        const AttentionInputs c = attention_inputs(q, k, v, key_mask);
        AttentionOptions o = attention_options(kernel, causal, scale, c.mask_view(), fit);
        o.precision = parse_precision(precision, "precision");
        o.save_causal_states = save_causal_states;
        o.window = window;
        o.sinks = sinks;
        return run_attention(c, save_context, [&](MutableTensorView out, AttentionContext* ctx) {
          return favor_attention(c.q.view, c.k.view, c.v.view, w, out, o, ctx);
        });
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("projection"),
      py::arg("kernel") = "positive", py::arg("causal") = false, py::arg("scale") = py::none(),
      py::arg("key_mask") = py::none(), py::arg("fit") = py::none(),
      py::arg("save_context") = false, py::arg("precision") = "f32",
      py::arg("save_causal_states") = false, py::arg("window") = 0, py::arg("sinks") = 0);

  m.def(
      "attention_backward",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const py::handle& dy,
         const Projection& w, const std::string& kernel, bool causal, std::optional<double> scale,
         const py::handle& key_mask, const std::optional<KernelFit>& fit, bool projection_grad,
         const py::handle& context, int64_t window, int64_t sinks) {
        const AttentionInputs c = attention_inputs(q, k, v, key_mask);
        const Input g = c.gradient(dy);
        AttentionOptions o = attention_options(kernel, causal, scale, c.mask_view(), fit);
        o.window = window;
        o.sinks = sinks;
        const std::optional<AttentionContextView> saved = context_view(context);
        AttentionGrads grads;
        {
          py::gil_scoped_release release;
          grads = saved ? favor_attention_backward(c.q.view, c.k.view, c.v.view, g.view, w, o,
                                                   projection_grad, *saved)
                        : favor_attention_backward(c.q.view, c.k.view, c.v.view, g.view, w, o,
                                                   projection_grad);
        }
        return grads_tuple(std::move(grads), c.q.rank);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("dy"), py::arg("projection"),
      py::arg("kernel") = "positive", py::arg("causal") = false, py::arg("scale") = py::none(),
      py::arg("key_mask") = py::none(), py::arg("fit") = py::none(),
      py::arg("projection_grad") = false, py::arg("context") = py::none(), py::arg("window") = 0,
      py::arg("sinks") = 0);

  // What a windowed exact call saves for its backward (ExactContext): lse [B*H*Nq] float64
  // and the fingerprint of its inputs, output and options; taken out and put back as arrays
  // (favor::exact_attention carries them between forward and backward as tensors).
  py::class_<ExactContext>(m, "ExactContext")
      .def_property_readonly("valid", &ExactContext::valid)
      .def_property_readonly("lse",
                             [](py::object self) { return view_of(self, &ExactContext::lse); })
      .def_readonly("fingerprint", &ExactContext::fingerprint)
      .def_static(
          "from_arrays",
          [](const py::handle& lse, uint64_t fingerprint) {
            auto x = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(lse);
            if (!x || x.ndim() != 1 || x.size() == 0) {  // its size: by the backward
              throw Error("lse: must be a non-empty 1-D float array");
            }
            ExactContext c;
            c.lse.assign(x.data(), x.data() + x.size());
            c.fingerprint = fingerprint;
            return c;
          },
          py::arg("lse"), py::arg("fingerprint"));

  m.def(
      "exact_attention",
      [](const py::handle& q, const py::handle& k, const py::handle& v, bool causal,
         std::optional<double> scale, const py::handle& key_mask, const std::string& accumulate,
         int64_t window, int64_t sinks, bool save_context) -> py::object {
        const AttentionInputs c = attention_inputs(q, k, v, key_mask);
        ExactOptions o = exact_options(causal, scale, c, accumulate);
        o.window = window;
        o.sinks = sinks;
        const Shape4 shape = c.output_shape();
        py::array_t<float> y = new_output(shape, c.q.rank);
        const MutableTensorView out = output_view(y, shape);
        ExactContext context;
        {
          py::gil_scoped_release release;
          exact_attention(c.q.view, c.k.view, c.v.view, out, o, save_context ? &context : nullptr);
        }
        if (!save_context) return y;
        py::object saved = py::none();  // (only a windowed call saves one)
        if (context.valid()) saved = py::cast(std::move(context));
        return py::make_tuple(y, saved);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal") = false,
      py::arg("scale") = py::none(), py::arg("key_mask") = py::none(),
      py::arg("accumulate") = "f32", py::arg("window") = 0, py::arg("sinks") = 0,
      py::arg("save_context") = false);

  m.def(
      "exact_attention_backward",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const py::handle& dy,
         bool causal, std::optional<double> scale, const py::handle& key_mask, int64_t window,
         int64_t sinks, const py::handle& y, const ExactContext* context) {
        const AttentionInputs c = attention_inputs(q, k, v, key_mask);
        const Input g = c.gradient(dy);
        ExactOptions o = exact_options(causal, scale, c, "f32");
        o.window = window;
        o.sinks = sinks;
        if ((context != nullptr) != !y.is_none()) {
          throw Error(
              "y, context: give both (the output and context of a windowed forward) "
              "or neither");
        }
        std::optional<Input> out;
        if (context) out = c.gradient(y, "y");
        AttentionGrads grads;
        {
          py::gil_scoped_release release;
          grads = context ? exact_attention_backward(c.q.view, c.k.view, c.v.view, g.view,
                                                     out->view, *context, o)
                          : exact_attention_backward(c.q.view, c.k.view, c.v.view, g.view, o);
        }
        return grads_tuple(std::move(grads), c.q.rank);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("dy"), py::arg("causal") = false,
      py::arg("scale") = py::none(), py::arg("key_mask") = py::none(), py::arg("window") = 0,
      py::arg("sinks") = 0, py::arg("y") = py::none(), py::arg("context") = nullptr);

  m.def(
      "features",
      [](const py::handle& x, const Projection& w, const std::string& kernel,
         std::optional<double> scale, const std::optional<KernelFit>& fit) {
        const Input xi = as_input(x, "x");
        const FeatureOptions o = feature_options(kernel, scale, fit);
        Tensor phi;
        {
          py::gil_scoped_release release;
          phi = features(xi.view, w, o);
        }
        return to_array(std::move(phi), xi.rank);
      },
      py::arg("x"), py::arg("projection"), py::arg("kernel") = "positive",
      py::arg("scale") = py::none(), py::arg("fit") = py::none());

  m.def(
      "relative_frobenius_error",
      [](const py::handle& approx, const py::handle& exact) {
        const Input a = as_input(approx, "approx"), e = as_input(exact, "exact");
        py::gil_scoped_release release;
        return relative_frobenius_error(a.view, e.view);
      },
      py::arg("approx"), py::arg("exact"));

  m.def(
      "kernel_mse",
      [](const py::handle& x, const py::handle& y, const Projection& w, const std::string& kernel,
         std::optional<double> scale, const std::optional<KernelFit>& fit) {
        const Input xi = as_input(x, "x"), yi = as_input(y, "y");
        const TensorView xv = rows(xi, "x"), yv = rows(yi, "y");
        const FeatureOptions o = feature_options(kernel, scale, fit);
        py::gil_scoped_release release;
        return kernel_mse(xv, yv, w, o);
      },
      py::arg("x"), py::arg("y"), py::arg("projection"), py::arg("kernel") = "positive",
      py::arg("scale") = py::none(), py::arg("fit") = py::none());
}

}  // namespace favor::python
