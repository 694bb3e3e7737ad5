// Threads, build information, the double reference and a C++-side timer (for measuring
// the Python layer's overhead in favor.bench).
#include <pybind11/stl.h>

#include <chrono>

#include "arrays.hpp"
#include "bindings.hpp"
#include "options.hpp"

namespace favor::python {

void bind_runtime(py::module_& m) {
  m.def("build_info", &build_info);
  m.def("bf16_available", &bf16_available,
        "Whether attention(..., precision='bf16') runs in bf16 here (AVX512-BF16, oneDNN, "
        "FAVOR_NO_BF16 unset)");
  m.def("set_num_threads", &set_num_threads, py::arg("n"));
  m.def("num_threads", &num_threads);
  m.def("release_freed_memory", &release_freed_memory,
        "Gives memory freed but held by the allocator back to the system (glibc's "
        "malloc_trim); whether it could");
  m.def("kernel_info", [] {
    const KernelInfo k = kernel_info();
    py::dict d;
    d["row_tile"] = k.row_tile;
    d["causal_chunk"] = k.causal_chunk;
    return d;
  });

  m.def(
      "time_attention",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const Projection& w,
         const std::string& kernel, bool causal, int repeats) {
        if (repeats < 1) throw Error("repeats: " + std::to_string(repeats) + " must be >= 1");
        const Input qi = as_input(q, "q"), ki = as_input(k, "k"), vi = as_input(v, "v");
        const AttentionOptions o =
            attention_options(kernel, causal, std::nullopt, std::nullopt, std::nullopt);
        Tensor out({qi.view.shape[0], qi.view.shape[1], qi.view.shape[2], vi.view.shape[3]});
        std::vector<double> seconds;
        py::gil_scoped_release release;
        for (int r = 0; r < repeats; ++r) {
          const auto t0 = std::chrono::steady_clock::now();
          favor_attention(qi.view, ki.view, vi.view, w, out.mutable_view(), o);
          seconds.push_back(
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        return seconds;
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("projection"),
      py::arg("kernel") = "positive", py::arg("causal") = false, py::arg("repeats") = 10);

  py::module_ ref = m.def_submodule("reference", "The double-precision reference (O(N^2)).");
  ref.def(
      "features",
      [](const py::handle& x, const Projection& w, const std::string& kernel,
         std::optional<double> scale, const std::optional<KernelFit>& fit) {
        const Input xi = as_input(x, "x");
        return to_array(reference::features(xi.view, w, feature_options(kernel, scale, fit)),
                        xi.rank);
      },
      py::arg("x"), py::arg("projection"), py::arg("kernel") = "positive",
      py::arg("scale") = py::none(), py::arg("fit") = py::none());
  ref.def(
      "favor_attention",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const Projection& w,
         const std::string& kernel, bool causal, std::optional<double> scale,
         const py::handle& key_mask, const std::optional<KernelFit>& fit) {
        const Input qi = as_input(q, "q"), ki = as_input(k, "k"), vi = as_input(v, "v");
        check_same_rank({&qi, &ki, &vi}, "q, k, v");
        const auto mask =
            as_mask(key_mask, ki.rank, ki.view.shape[0], ki.view.shape[2], "key_mask");
        return to_array(reference::favor_attention(
                            qi.view, ki.view, vi.view, w,
                            attention_options(kernel, causal, scale, mask_view(mask), fit)),
                        qi.rank);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("projection"),
      py::arg("kernel") = "positive", py::arg("causal") = false, py::arg("scale") = py::none(),
      py::arg("key_mask") = py::none(), py::arg("fit") = py::none());
  ref.def(
      "exact_attention",
      [](const py::handle& q, const py::handle& k, const py::handle& v, bool causal,
         std::optional<double> scale, const py::handle& key_mask) {
        const Input qi = as_input(q, "q"), ki = as_input(k, "k"), vi = as_input(v, "v");
        check_same_rank({&qi, &ki, &vi}, "q, k, v");
        const auto mask =
            as_mask(key_mask, ki.rank, ki.view.shape[0], ki.view.shape[2], "key_mask");
        ExactOptions o;
        o.causal = causal;
        o.scale = scale;
        if (mask) o.key_mask = mask->view;
        return to_array(reference::exact_attention(qi.view, ki.view, vi.view, o), qi.rank);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal") = false,
      py::arg("scale") = py::none(), py::arg("key_mask") = py::none());
}

}  // namespace favor::python
