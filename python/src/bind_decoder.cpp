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
      .def_property_readonly("projection", [](PyDecoder& s) { return s.decoder.projection(); })
      .def(
          "state",
          [](PyDecoder& self) {
            DecoderState st;
            {
              std::lock_guard<std::mutex> lock(self.mutex);
              st = self.decoder.state();
            }
            py::dict d;
            d["sums"] = state_array(st.sums, {st.batch, st.heads, st.features, st.dv + 1});
            d["log_max"] = state_array(st.log_max, {st.batch, st.heads});
            d["row_positions"] = state_array(st.row_positions, {st.batch});
            d["position"] = st.position;
            return d;
          },
          "A copy of the state: {'sums': float32 [B, H, F, Dv + 1] ([S | s] relative to "
          "exp(log_max)), 'log_max': float64 [B, H] (-inf: no key yet), 'row_positions': int64 "
          "[B] (unmasked tokens per row, the decay clock), 'position': int}.")
      .def(
          "load_state",
          [](PyDecoder& self, const py::handle& sums, const py::handle& log_max,
             const py::handle& row_positions, int64_t position) {
            std::lock_guard<std::mutex> lock(self.mutex);
            const Decoder& dec = self.decoder;
            const int64_t B = dec.batch(), H = dec.heads(), F = dec.features(), Dv = dec.dv();
            DecoderState st{B, H, F, Dv, position, {}, {}, {}};
            state_input(sums, {B, H, F, Dv + 1}, "sums", "[batch, heads, features, dv + 1]",
                        st.sums);
            state_input(log_max, {B, H}, "log_max", "[batch, heads]", st.log_max);
            state_input(row_positions, {B}, "row_positions", "[batch]", st.row_positions);
            self.decoder.load_state(st);
          },
          py::arg("sums"), py::arg("log_max"), py::arg("row_positions"), py::arg("position"),
          "Replaces the state by arrays shaped as state() returns them (load_state(**state())); "
          "shapes and values are checked, favor.Error naming the argument otherwise.");
}

}  // namespace favor::python
