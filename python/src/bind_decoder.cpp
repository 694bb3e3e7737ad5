// favor.Decoder: streaming decode. The GIL is released while it computes, so a mutex
// keeps two Python threads from using one decoder at once (favor::Decoder is not
// thread-safe).
#include <pybind11/stl.h>

#include <mutex>

#include "arrays.hpp"
#include "bindings.hpp"
#include "options.hpp"

namespace favor::python {
namespace {

struct PyDecoder {
  Decoder decoder;
  std::mutex mutex;
};

}  // namespace

void bind_decoder(py::module_& m) {
  py::class_<PyDecoder>(m, "Decoder")
      .def(py::init([](int64_t batch, int64_t heads, int64_t dv, const Projection& w,
                       const std::string& kernel, std::optional<double> scale,
                       const std::optional<KernelFit>& fit) {
             return new PyDecoder{Decoder(batch, heads, dv, w, decoder_options(kernel, scale, fit)),
                                  {}};
           }),
           py::arg("batch"), py::arg("heads"), py::arg("dv"), py::arg("projection"),
           py::arg("kernel") = "positive", py::arg("scale") = py::none(),
           py::arg("fit") = py::none())
      .def(
          "append",
          [](PyDecoder& self, const py::handle& k, const py::handle& v) {
            const Input ki = as_input(k, "k"), vi = as_input(v, "v");
            check_same_rank({&ki, &vi}, "k, v");
            py::gil_scoped_release release;
            std::lock_guard<std::mutex> lock(self.mutex);
            self.decoder.append(ki.view, vi.view);
          },
          py::arg("k"), py::arg("v"))
      .def(
          "query",
          [](PyDecoder& self, const py::handle& q) {
            const Input qi = as_input(q, "q");
            const Shape4 shape{qi.view.shape[0], qi.view.shape[1], qi.view.shape[2],
                               self.decoder.dv()};
            py::array_t<float> y = new_output(shape, qi.rank);
            const MutableTensorView out = output_view(y, shape);
            {
              py::gil_scoped_release release;
              std::lock_guard<std::mutex> lock(self.mutex);
              self.decoder.query(qi.view, out);
            }
            return y;
          },
          py::arg("q"))
      .def("reset",
           [](PyDecoder& self) {
             std::lock_guard<std::mutex> lock(self.mutex);
             self.decoder.reset();
           })
      .def_property_readonly("position", [](PyDecoder& s) { return s.decoder.position(); })
      .def_property_readonly("batch", [](PyDecoder& s) { return s.decoder.batch(); })
      .def_property_readonly("heads", [](PyDecoder& s) { return s.decoder.heads(); })
      .def_property_readonly("dv", [](PyDecoder& s) { return s.decoder.dv(); })
      .def_property_readonly("projection", [](PyDecoder& s) { return s.decoder.projection(); })
      .def_property_readonly("state_bytes", [](PyDecoder& s) { return s.decoder.state_bytes(); });
}

}  // namespace favor::python
