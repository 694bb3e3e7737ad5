// favor._core.fit_features (favor::fit_features: the one distillation fit, which
// favor.fit_features in python/favor/fit.py wraps and `favor fit` runs) and the rules it
// shares with its callers: floor_lambda and heldout_count.
#include <pybind11/stl.h>

#include <cstring>
#include <optional>
#include <utility>

#include "arrays.hpp"
#include "bindings.hpp"

namespace favor::python {
namespace {

/// The error `e` with the C++ option names replaced by the keyword arguments of
/// favor.fit_features ("options.learning_rate: ..." -> "lr: ..."); other errors unchanged.
Error renamed_option_error(const Error& e) {
  const std::string what = e.what();
  for (const auto& [internal, name] :
       {std::pair<std::string, std::string>{"options.steps:", "steps:"},
        {"options.learning_rate:", "lr:"},
        {"options.lambda_floor:", "lambda_floor:"},
        {"options.eval_every:", "eval_every:"},
        {"options:", "learn:"}}) {
    if (what.rfind(internal, 0) == 0) return Error(name + what.substr(internal.size()));
  }
  return e;
}

py::object array_or_none(const std::vector<float>& values, std::vector<py::ssize_t> shape) {
  if (values.empty()) return py::none();
  return to_array(std::vector<float>(values), std::move(shape));
}

/// A gradient the objective returned (None: empty) as floats.
std::vector<float> gradient(const py::handle& g, const char* name) {
  if (g.is_none()) return {};
  auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(g);
  if (!a) throw Error(std::string("objective: its ") + name + " gradient is not a float array");
  std::vector<float> values(static_cast<size_t>(a.size()));
  if (!values.empty()) std::memcpy(values.data(), a.data(), sizeof(float) * values.size());
  return values;
}

py::dict step_dict(const FitStep& s) {
  py::dict d;
  d["step"] = s.step;
  d["loss"] = s.loss;
  d["heldout_error"] = s.heldout_error;
  d["seconds"] = s.seconds;
  return d;
}

}  // namespace

void bind_fit(py::module_& m) {
  m.def(
      "fit_features",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const py::handle& hq,
         const py::handle& hk, const py::handle& hv, const FeatureMap& start, int steps, double lr,
         bool causal, bool learn_weights, bool learn_bias, bool learn_lambda, double lambda_floor,
         int eval_every, uint64_t seed, const py::object& objective, const py::object& on_step) {
        const Input qi = as_input(q, "q"), ki = as_input(k, "k"), vi = as_input(v, "v");
        const Input hqi = as_input(hq, "heldout_q"), hki = as_input(hk, "heldout_k"),
                    hvi = as_input(hv, "heldout_v");
        FitOptions o;
        o.steps = steps;
        o.learning_rate = lr;
        o.causal = causal;
        o.learn_weights = learn_weights;
        o.learn_bias = learn_bias;
        o.learn_lambda = learn_lambda;
        o.lambda_floor = lambda_floor;
        o.eval_every = eval_every;
        o.seed = seed;
        if (!objective.is_none()) {
          o.objective = [&objective](const FeatureMap& map, AttentionGrads& grads) {
            py::gil_scoped_acquire gil;
            const py::ssize_t h = map.heads, mm = map.m(), d = map.d();
            const py::tuple r =
                objective(array_or_none(map.weights, {h, mm, d}), array_or_none(map.bias, {h, mm}),
                          array_or_none(map.lambda, {h, mm}));
            if (r.size() != 4)
              throw Error("objective: must return (loss, dweights, dbias, dlambda)");
            grads.dw = gradient(r[1], "weights");
            grads.dbias = gradient(r[2], "bias");
            grads.dlambda = gradient(r[3], "lambda");
            return r[0].cast<double>();
          };
        }
        std::function<void(const FitStep&)> report;
        if (!on_step.is_none()) {
          report = [&on_step](const FitStep& s) {
            py::gil_scoped_acquire gil;
            on_step(step_dict(s));
          };
        }
        std::optional<FitResult> fitted;
        try {
          py::gil_scoped_release release;
          fitted = fit_features({qi.view, ki.view, vi.view, std::nullopt},
                                {hqi.view, hki.view, hvi.view, std::nullopt}, start, o, report);
        } catch (const Error& e) {
          throw renamed_option_error(e);
        }
        FitResult& r = *fitted;
        py::list history;
        for (const FitStep& s : r.history) history.append(step_dict(s));
        return py::make_tuple(std::move(r.map), history);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("heldout_q"), py::arg("heldout_k"),
      py::arg("heldout_v"), py::arg("start"), py::kw_only(), py::arg("steps") = 200,
      py::arg("lr") = 0.01, py::arg("causal") = false, py::arg("learn_weights") = true,
      py::arg("learn_bias") = true, py::arg("learn_lambda") = true, py::arg("lambda_floor") = 1e-3,
      py::arg("eval_every") = 1, py::arg("seed") = 0, py::arg("objective") = py::none(),
      py::arg("on_step") = py::none(),
      "favor::fit_features: fits start's learned parameters to q, k, v ([B, H, N, D]), the "
      "held-out error on heldout_q/k/v; returns (FeatureMap, history: a dict per evaluated "
      "step). objective (None: the attention-output MSE): called with the map's weights, bias, "
      "lambda (arrays or None), returns (loss, dweights, dbias, dlambda). on_step: called with "
      "each evaluated step's dict as it happens. Option errors name these arguments.");

  m.def(
      "floor_lambda",
      [](py::array_t<float, py::array::c_style> lambda, double floor) {
        floor_lambda(lambda.mutable_data(), static_cast<size_t>(lambda.size()), floor);
      },
      py::arg("lambda_").noconvert(), py::arg("floor"),
      "favor::floor_lambda in place on a C-contiguous float32 array: each |lambda| below floor "
      "raised to it (in float32), its sign kept (FitOptions::lambda_floor).");

  m.def("heldout_count", &heldout_count, py::arg("fraction"), py::arg("n"),
        py::arg("name") = "holdout",
        "favor::heldout_count: how many of n sequences (or tokens) a holdout fraction holds out.");
}

}  // namespace favor::python
