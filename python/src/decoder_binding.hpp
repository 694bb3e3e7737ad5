#pragma once
// What favor.Decoder and favor.VQDecoder share: the GIL is released while a decoder
// computes, so a mutex keeps two Python threads from using one decoder at once (neither
// favor::Decoder nor favor::VQDecoder is thread-safe).
#include <mutex>

#include "arrays.hpp"

namespace favor::python {

/// A streaming decoder as Python holds it: the decoder and the mutex that serialises calls.
template <typename D>
struct Locked {
  D decoder;
  std::mutex mutex;
};

/// The class `name` with append(k, v), query(q), reset() and the properties position,
/// batch, heads, dv and state_bytes; the caller adds the constructor and what differs.
template <typename D>
py::class_<Locked<D>> bind_streaming_decoder(py::module_& m, const char* name) {
  using Self = Locked<D>;
  py::class_<Self> cls(m, name);
  cls.def(
         "append",
         [](Self& self, const py::handle& k, const py::handle& v) {
           const Input ki = as_input(k, "k"), vi = as_input(v, "v");
           check_same_rank({&ki, &vi}, "k, v");
           py::gil_scoped_release release;
           std::lock_guard<std::mutex> lock(self.mutex);
           self.decoder.append(ki.view, vi.view);
         },
         py::arg("k"), py::arg("v"))
      .def(
          "query",
          [](Self& self, const py::handle& q) {
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
           [](Self& self) {
             std::lock_guard<std::mutex> lock(self.mutex);
             self.decoder.reset();
           })
      .def_property_readonly("position", [](Self& s) { return s.decoder.position(); })
      .def_property_readonly("batch", [](Self& s) { return s.decoder.batch(); })
      .def_property_readonly("heads", [](Self& s) { return s.decoder.heads(); })
      .def_property_readonly("dv", [](Self& s) { return s.decoder.dv(); })
      .def_property_readonly("state_bytes", [](Self& s) { return s.decoder.state_bytes(); });
  return cls;
}

}  // namespace favor::python
