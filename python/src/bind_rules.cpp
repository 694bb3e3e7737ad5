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

void bind_rules(py::module_& m) {
  m.def(
      "kernel_names",
      [] {
        std::vector<std::pair<std::string, std::string>> names;
        for (const auto& [name, kernel] : kernel_names()) names.emplace_back(name, to_string(kernel));
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
      py::arg("kernel_argument") = "kernel",
      py::arg("calibration") = "a KernelFit from fit_kernel",
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
