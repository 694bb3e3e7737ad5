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
      .def_property_readonly(
          "features", [](PyDecoder& s) { return s.decoder.features(); },
          "F: the features per token (the rows of the state's sums).")
      .def(
          "step_state",
          [](PyDecoder& self, const py::handle& sums, const py::handle& log_max,
             const py::handle& row_positions, const py::handle& position, const py::handle& q,
             const py::handle& k, const py::handle& v, const py::handle& key_mask,
             const std::string& mode) {
            const Decoder& dec = self.decoder;
            const int64_t B = dec.batch(), H = dec.heads(), F = dec.features(), Dv = dec.dv();
            DecoderStateView st;
            st.sums = borrowed_state<float>(sums, {B, H, F, Dv + 1}, "sums",
                                            "[batch, heads, features, dv + 1]");
            st.log_max = borrowed_state<double>(log_max, {B, H}, "log_max", "[batch, heads]");
            st.row_positions =
                borrowed_state<int64_t>(row_positions, {B}, "row_positions", "[batch]");
            st.position = borrowed_state<int64_t>(position, {1}, "position", "[1]");
            return run_mode(self, st, q, k, v, key_mask, mode,
                            [&](TensorView qv, MutableTensorView out) {
                              self.decoder.query(st.sums, qv, out);
                            });
          },
          py::arg("sums"), py::arg("log_max"), py::arg("row_positions"), py::arg("position"),
          py::arg("q"), py::arg("k"), py::arg("v"), py::arg("key_mask") = py::none(),
          py::arg("mode") = "step",
          "The functional decoder (favor::decode_step): the state given as arrays (float32 "
          "sums [B, H, F, Dv + 1], float64 log_max [B, H], int64 row_positions [B], int64 "
          "position [1], C-contiguous, writeable) is advanced in place and y [B, H, T, Dv] "
          "returned; this decoder lends its map only. mode 'step' (T = 1, fused), 'prefill' "
          "(causal attention over T tokens), 'append_query' (append T tokens, then every "
          "query reads the state), 'append' (k, v only; y empty) or 'query' (q only).")
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

  // Hybrid attention's decoder (favor/hybrid_decoder.hpp): a ring of the window, the sinks
  // and a Decoder fed the tokens that leave the window.
  using PyHybrid = Locked<HybridDecoder>;
  bind_streaming_decoder<HybridDecoder>(m, "HybridDecoder")
      .def(py::init([](int64_t batch, int64_t heads, int64_t dv, const FeatureMap& map,
                       int64_t window, int64_t sinks, std::vector<double> decay) {
             DecoderOptions o;
             o.decay = std::move(decay);
             try {
               return new PyHybrid{HybridDecoder(batch, heads, dv, map, window, sinks, o), {}};
             } catch (const Error& e) {
               throw renamed_map_error(e);
             }
           }),
           py::arg("batch"), py::arg("heads"), py::arg("dv"), py::arg("feature_map"),
           py::arg("window"), py::arg("sinks") = 0, py::arg("decay") = std::vector<double>{})
      .def_property_readonly("window", [](PyHybrid& s) { return s.decoder.window(); })
      .def_property_readonly("sinks", [](PyHybrid& s) { return s.decoder.sinks(); });
}

}  // namespace favor::python
