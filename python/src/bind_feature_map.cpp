// favor._core.FeatureMap and the calls that take one: attention_map, attention_map_backward,
// features_map (favor.FeatureMap in python/favor/feature_map.py builds the map; favor.attention
// and friends choose these calls when a map or a decay is given).
#include <pybind11/stl.h>

#include <cstring>

#include "arrays.hpp"
#include "attention_call.hpp"
#include "bindings.hpp"
#include "options.hpp"

namespace favor::python {
namespace {

std::string shape_of(const py::array& a) {
  std::string s = "[";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) s += (i ? "," : "") + std::to_string(a.shape(i));
  return s + "]";
}

/// The values of an optional float array of shape `want` (empty for None); favor::Error
/// naming `name` for another shape or dtype.
std::vector<float> parameter(const py::handle& obj, const std::vector<int64_t>& want,
                             const std::string& name, const std::string& layout) {
  if (obj.is_none()) return {};
  py::array a = py::array::ensure(obj);
  if (!a) throw Error(name + ": cannot be read as an array");
  if (a.dtype().kind() != 'f') {
    throw Error(name + ": dtype " + py::str(a.dtype()).cast<std::string>() +
                " is not a float type");
  }
  bool ok = a.ndim() == static_cast<py::ssize_t>(want.size());
  for (size_t i = 0; ok && i < want.size(); ++i) ok = a.shape(i) == want[i];
  if (!ok) throw Error(name + ": shape " + shape_of(a) + " must be " + layout);
  auto c = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(a);
  std::vector<float> values(static_cast<size_t>(c.size()));
  if (!values.empty()) std::memcpy(values.data(), c.data(), sizeof(float) * values.size());
  return values;
}

FeatureMap make_map(const Projection& w, const std::string& kernel, std::optional<double> scale,
                    const std::optional<KernelFit>& fit, int64_t heads, const py::handle& weights,
                    const py::handle& bias, const py::handle& lambda) {
  if (heads < 1) throw Error("heads: " + std::to_string(heads) + " must be >= 1");
  FeatureMap map(w, parse_kernel(kernel, "kernel"));
  map.scale = scale;
  map.fit = fit;
  map.heads = heads;
  const int64_t m = w.m(), d = w.d();
  const std::string sets = "[heads=" + std::to_string(heads) + ", m=" + std::to_string(m);
  map.weights =
      parameter(weights, {heads, m, d}, "weights", sets + ", d=" + std::to_string(d) + "]");
  map.bias = parameter(bias, {heads, m}, "bias", sets + "]");
  map.lambda = parameter(lambda, {heads, m}, "lambda", sets + "]");
  check_feature_map(map, d, heads, heads, "feature_map");
  return map;
}

py::object copy_or_none(const std::vector<float>& values, std::vector<py::ssize_t> shape) {
  if (values.empty()) return py::none();
  py::array_t<float> a(shape);
  std::memcpy(a.mutable_data(), values.data(), sizeof(float) * values.size());
  return a;
}

}  // namespace

void bind_feature_map(py::module_& m) {
  py::class_<FeatureMap>(m, "FeatureMap")
      .def(py::init(&make_map), py::arg("projection"), py::arg("kernel") = "positive",
           py::arg("scale") = py::none(), py::arg("fit") = py::none(), py::arg("heads") = 1,
           py::arg("weights") = py::none(), py::arg("bias") = py::none(),
           py::arg("lambda_") = py::none())
      .def_property_readonly("kernel", [](const FeatureMap& f) { return to_string(f.kernel); })
      .def_property_readonly("projection", [](const FeatureMap& f) { return f.projection; })
      .def_readonly("scale", &FeatureMap::scale)
      .def_readonly("fit", &FeatureMap::fit)
      .def_readonly("heads", &FeatureMap::heads)
      .def_property_readonly("m", &FeatureMap::m)
      .def_property_readonly("d", &FeatureMap::d)
      .def_property_readonly("features", &FeatureMap::features)
      .def_property_readonly(
          "weights",
          [](const FeatureMap& f) { return copy_or_none(f.weights, {f.heads, f.m(), f.d()}); })
      .def_property_readonly(
          "bias", [](const FeatureMap& f) { return copy_or_none(f.bias, {f.heads, f.m()}); })
      .def_property_readonly(
          "lambda_", [](const FeatureMap& f) { return copy_or_none(f.lambda, {f.heads, f.m()}); });

  m.def(
      "attention_map",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const FeatureMap& map,
         bool causal, const py::handle& key_mask, std::vector<double> decay, bool save_context,
         const std::string& precision, bool save_causal_states, int64_t window, int64_t sinks) {
        const AttentionInputs c = attention_inputs(q, k, v, key_mask);
        AttentionOptions o = map_options(causal, c, std::move(decay));
        o.precision = parse_precision(precision, "precision");
        o.save_causal_states = save_causal_states;
        o.window = window;
        o.sinks = sinks;
        return run_attention(c, save_context, [&](MutableTensorView out, AttentionContext* ctx) {
          return renaming_map(
              [&] { return favor_attention(c.q.view, c.k.view, c.v.view, map, out, o, ctx); });
        });
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("feature_map"), py::arg("causal") = false,
      py::arg("key_mask") = py::none(), py::arg("decay") = std::vector<double>{},
      py::arg("save_context") = false, py::arg("precision") = "f32",
      py::arg("save_causal_states") = false, py::arg("window") = 0, py::arg("sinks") = 0);

  m.def(
      "attention_map_backward",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const py::handle& dy,
         const FeatureMap& map, bool causal, const py::handle& key_mask, std::vector<double> decay,
         bool parameter_grads, const py::handle& context, int64_t window, int64_t sinks) {
        const AttentionInputs c = attention_inputs(q, k, v, key_mask);
        const Input g = c.gradient(dy);
        AttentionOptions o = map_options(causal, c, std::move(decay));
        o.window = window;
        o.sinks = sinks;
        const std::optional<AttentionContextView> saved = context_view(context);
        AttentionGrads grads;
        {
          py::gil_scoped_release release;
          grads = renaming_map([&] {
            return saved ? favor_attention_backward(c.q.view, c.k.view, c.v.view, g.view, map, o,
                                                    parameter_grads, *saved)
                         : favor_attention_backward(c.q.view, c.k.view, c.v.view, g.view, map, o,
                                                    parameter_grads);
          });
        }
        return map_grads_tuple(std::move(grads), map, c.q.rank);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("dy"), py::arg("feature_map"),
      py::arg("causal") = false, py::arg("key_mask") = py::none(),
      py::arg("decay") = std::vector<double>{}, py::arg("parameter_grads") = false,
      py::arg("context") = py::none(), py::arg("window") = 0, py::arg("sinks") = 0);

  m.def(
      "features_map",
      [](const py::handle& x, const FeatureMap& map) {
        const Input xi = as_input(x, "x");
        Tensor phi;
        {
          py::gil_scoped_release release;
          phi = renaming_map([&] { return features(xi.view, map); });
        }
        return to_array(std::move(phi), xi.rank);
      },
      py::arg("x"), py::arg("feature_map"));
}

}  // namespace favor::python
