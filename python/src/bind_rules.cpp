// The rules the CLI applies, bound so that python/favor/_args.py applies the same ones with
// the same messages: kernel names, which kernels take a fit, the feature-map .npz file
// (src/io/map_file.hpp, the CLI's reader and writer).
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "favor/favor.hpp"
#include "map_file.hpp"
#include "npy.hpp"
#include "options.hpp"

namespace favor::python {
namespace py = pybind11;

namespace {

// A shape as C++ takes it: [N, D] as [1, 1, N, D]; another rank is as_input's error.
Shape4 shape_of(const std::vector<int64_t>& dims, const std::string& name) {
  if (dims.size() != 2 && dims.size() != 4) {
    throw Error(name + ": has rank " + std::to_string(dims.size()) +
                "; must be 2-D [N, D] (one head) or 4-D [B, H, N, D]");
  }
  Shape4 s{1, 1, 1, 1};
  const size_t offset = 4 - dims.size();
  for (size_t i = 0; i < dims.size(); ++i) s[offset + i] = dims[i];
  return s;
}

}  // namespace

void bind_rules(py::module_& m) {
  m.def(
      "kernel_form",
      [](const std::string& kernel) {
        const KernelForm f = kernel_form(parse_kernel(kernel, "kernel"));
        return py::make_tuple(to_string(parse_kernel(kernel, "kernel")), f.form, f.key_norm);
      },
      py::arg("kernel"),
      "(canonical name, form, key_norm) of a kernel (favor::kernel_form): form 'exp', "
      "'exp_pm' or 'trig', the features' shape every kernel computes in; key_norm the "
      "coefficient of |x|^2 in the key's log weight (-1/2, +1/2 or 0).");
  m.def(
      "check_attention_shapes",
      [](const std::vector<int64_t>& q, const std::vector<int64_t>& k,
         const std::vector<int64_t>& v, bool causal,
         const std::optional<std::vector<int64_t>>& key_mask, int64_t window, int64_t sinks) {
        if (q.size() != k.size() || q.size() != v.size())
          throw Error("q, k, v: must all be 2-D [N, D] or all be 4-D [B, H, N, D]");
        const Shape4 qs = shape_of(q, "q"), ks = shape_of(k, "k"), vs = shape_of(v, "v");
        std::optional<std::array<int64_t, 2>> mask;
        if (key_mask) {
          if (key_mask->size() != 2) {
            std::string got;
            for (size_t i = 0; i < key_mask->size(); ++i)
              got += (i ? "," : "") + std::to_string((*key_mask)[i]);
            throw Error("key_mask: shape [" + got + "] must be [B, Nk] = [" +
                        std::to_string(ks[0]) + ',' + std::to_string(ks[2]) + ']');
          }
          mask = std::array<int64_t, 2>{(*key_mask)[0], (*key_mask)[1]};
        }
        check_attention_shapes(qs, ks, vs, causal, mask, window, sinks);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal") = false,
      py::arg("key_mask") = py::none(), py::arg("window") = 0, py::arg("sinks") = 0,
      "The shape rules of an attention call on the extents of q, k, v ([B, H, N, D] or "
      "[N, D]) and a key mask ([B, Nk]): favor.Error with C++'s message; no values read.");
  m.def(
      "check_key_mask_shape",
      [](const std::vector<int64_t>& shape, int64_t batch, int64_t n, const std::string& n_name,
         const std::string& argument) {
        if (shape.size() != 2) {
          std::string got;
          for (size_t i = 0; i < shape.size(); ++i)
            got += (i ? "," : "") + std::to_string(shape[i]);
          throw Error(argument + ": shape [" + got + "] must be [B, " + n_name + "] = [" +
                      std::to_string(batch) + ',' + std::to_string(n) + ']');
        }
        try {
          check_key_mask_shape(shape[0], shape[1], batch, n, n_name.c_str());
        } catch (const Error& e) {  // C++ names it key_mask; the caller's name instead
          const std::string what = e.what(), prefix = "key_mask";
          throw Error(what.rfind(prefix, 0) == 0 ? argument + what.substr(prefix.size()) : what);
        }
      },
      py::arg("shape"), py::arg("batch"), py::arg("n"), py::arg("n_name") = "Nk",
      py::arg("argument") = "key_mask",
      "A key mask's shape against [B, n] (favor::check_key_mask_shape; C++'s message, naming "
      "`argument`).");
  m.def("check_decoder_state_layout", &check_decoder_state_layout, py::arg("sums"),
        py::arg("log_max"), py::arg("row_positions"), py::arg("position"), py::arg("batch"),
        py::arg("heads"), py::arg("features"), py::arg("dv"),
        "The layout of a decoder state (its arrays' shapes) against a decoder's extents: "
        "favor.Error naming the field; no values read.");
  m.def(
      "kernel_names",
      [] {
        std::vector<std::pair<std::string, std::string>> names;
        for (const auto& [name, kernel] : kernel_names())
          names.emplace_back(name, to_string(kernel));
        return names;
      },
      "Every kernel name favor accepts, (name, canonical name) pairs: the canonical names, "
      "then the aliases.");
  m.def(
      "parse_kernel",
      [](const std::string& text, const std::string& argument) {
        return to_string(parse_kernel(text, argument));
      },
      py::arg("kernel"), py::arg("argument") = "kernel",
      "The canonical name of a kernel name or alias; favor.Error naming `argument` otherwise.");
  m.def(
      "data_adapted",
      [](const std::string& kernel) { return data_adapted(parse_kernel(kernel, "kernel")); },
      py::arg("kernel"), "True for the kernels whose parameters come from a KernelFit.");
  m.def(
      "feature_log_constant",
      [](const std::string& kernel, int64_t m) {
        return feature_log_constant(parse_kernel(kernel, "kernel"), m);
      },
      py::arg("kernel"), py::arg("m"),
      "log of each feature's constant factor for m projections (favor::feature_log_constant): "
      "-log(m)/2 (positive, trig, FAVOR++/# before their fit), -log(2m)/2 (hyperbolic), 0 "
      "(hedgehog).");
  m.def(
      "feature_count",
      [](const std::string& kernel, int64_t m) {
        if (m < 1) throw Error("m: " + std::to_string(m) + " must be >= 1");
        return feature_count(parse_kernel(kernel, "kernel"), m);
      },
      py::arg("kernel"), py::arg("m"), "Features per row for a kernel with m projection rows.");
  m.def(
      "check_fit_kernel",
      [](const std::string& kernel, bool constant, const std::string& fit_argument,
         const std::string& kernel_argument, const std::string& calibration) {
        check_fit_kernel(parse_kernel(kernel, kernel_argument), constant, fit_argument,
                         kernel_argument, calibration);
      },
      py::arg("kernel"), py::arg("constant"), py::arg("fit_argument") = "fit",
      py::arg("kernel_argument") = "kernel", py::arg("calibration") = "a KernelFit from fit_kernel",
      "The CLI's rule for a fit with this kernel (favor::check_fit_kernel).");
  m.def(
      "read_map_file",
      [](const std::string& path, const std::string& argument) {
        return io::read_map_file(path, argument);
      },
      py::arg("path"), py::arg("argument") = "path",
      "The FeatureMap of a feature-map .npz file, read as the CLI reads it.");
  m.def(
      "write_map_file",
      [](const std::string& path, const FeatureMap& map, const std::string& argument) {
        std::string bytes;
        try {
          bytes = io::encode_map_file(map);
        } catch (const Error& e) {
          throw renamed_map_error(e);
        }
        io::StagedOutputs out;
        out.stage(path, bytes, argument);
        out.commit();
      },
      py::arg("path"), py::arg("feature_map"), py::arg("argument") = "path",
      "Writes the map as a feature-map .npz file, as the CLI writes it.");
}

}  // namespace favor::python
