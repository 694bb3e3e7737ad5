// favor.Decoder: streaming decode, with a Projection or a FeatureMap and decay (the methods shared
// with VQDecoder: decoder_binding.hpp).
#include <pybind11/stl.h>

#include "arrays.hpp"
#include "bindings.hpp"
#include "decoder_binding.hpp"
#include "options.hpp"

namespace favor::python {

void bind_decoder(py::module_& m) {
  using PyDecoder = Locked<Decoder>;
  bind_streaming_decoder<Decoder>(m, "Decoder")
      .def(py::init([](int64_t batch, int64_t heads, int64_t dv, const Projection& w,
                       const std::string& kernel, std::optional<double> scale,
                       const std::optional<KernelFit>& fit) {
             return new PyDecoder{Decoder(batch, heads, dv, w, decoder_options(kernel, scale, fit)),
                                  {}};
           }),
           py::arg("batch"), py::arg("heads"), py::arg("dv"), py::arg("projection"),
           py::arg("kernel") = "positive", py::arg("scale") = py::none(),
           py::arg("fit") = py::none())
      .def(py::init([](int64_t batch, int64_t heads, int64_t dv, const FeatureMap& map,
                       std::vector<double> decay) {
             DecoderOptions o;
             o.decay = std::move(decay);
             try {
               return new PyDecoder{Decoder(batch, heads, dv, map, o), {}};
             } catch (const Error& e) {
               throw renamed_map_error(e);
             }
           }),
           py::arg("batch"), py::arg("heads"), py::arg("dv"), py::arg("feature_map"),
           py::arg("decay") = std::vector<double>{})
      .def_property_readonly("projection", [](PyDecoder& s) { return s.decoder.projection(); });
}

}  // namespace favor::python
