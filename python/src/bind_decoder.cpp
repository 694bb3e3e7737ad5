// favor.Decoder: streaming decode, with a Projection or a FeatureMap and decay (the methods shared
// with VQDecoder: decoder_binding.hpp).
#include <pybind11/stl.h>

#include "arrays.hpp"
#include "bindings.hpp"
#include "decoder_binding.hpp"
#include "options.hpp"

namespace favor::python {
namespace {

// The hybrid decoding state's fields, in order (HybridDecoderStateView's arrays; position
// [1] is the tokens seen), their dtypes and shapes.
constexpr const char* kHybridFields[] = {"sums",      "log_max",   "row_positions", "position",
                                         "ring_k",    "ring_v",    "ring_keep",     "ring_sink",
                                         "sink_k",    "sink_v",    "sink_pos"};
constexpr const char* kHybridDtypes[] = {"float32", "float64", "int64", "int64",
                                         "float32", "float32", "uint8", "uint8",
                                         "float32", "float32", "int64"};
constexpr const char* kHybridRules[] = {
    "[batch, heads, features, dv + 1]", "[batch, heads]",          "[batch]",
    "[1]",                              "[batch, heads, window, d]", "[batch, heads, window, dv]",
    "[batch, window]",                  "[batch, window]",          "[batch, heads, sinks, d]",
    "[batch, heads, sinks, dv]",        "[batch, sinks]"};

std::vector<std::vector<py::ssize_t>> hybrid_shapes(int64_t B, int64_t H, int64_t F, int64_t D,
                                                    int64_t Dv, int64_t W, int64_t S) {
  return {{B, H, F, Dv + 1}, {B, H}, {B}, {1}, {B, H, W, D}, {B, H, W, Dv}, {B, W}, {B, W},
          {B, H, S, D},      {B, H, S, Dv}, {B, S}};
}

std::vector<std::vector<py::ssize_t>> hybrid_shapes(const HybridDecoder& dec, int64_t batch) {
  return hybrid_shapes(batch, dec.heads(), dec.features(), dec.d(), dec.dv(), dec.window(),
                       dec.sinks());
}

// The memory of a hybrid state tuple (hybrid_state_layout's order), borrowed.
HybridDecoderStateView borrowed_hybrid_state(const HybridDecoder& dec, const py::tuple& st) {
  if (st.size() != 11)
    throw Error("state: " + std::to_string(st.size()) +
                " arrays, a hybrid decoding state has 11 (hybrid_state_layout)");
  const auto shapes = hybrid_shapes(dec, dec.batch());
  const char* const* f = kHybridFields;
  const char* const* r = kHybridRules;
  HybridDecoderStateView v;
  v.linear.sums = borrowed_state<float>(st[0], shapes[0], f[0], r[0]);
  v.linear.log_max = borrowed_state<double>(st[1], shapes[1], f[1], r[1]);
  v.linear.row_positions = borrowed_state<int64_t>(st[2], shapes[2], f[2], r[2]);
  v.position = borrowed_state<int64_t>(st[3], shapes[3], f[3], r[3]);
  v.ring_k = borrowed_state<float>(st[4], shapes[4], f[4], r[4]);
  v.ring_v = borrowed_state<float>(st[5], shapes[5], f[5], r[5]);
  v.ring_keep = borrowed_state<uint8_t>(st[6], shapes[6], f[6], r[6]);
  v.ring_sink = borrowed_state<uint8_t>(st[7], shapes[7], f[7], r[7]);
  v.sink_k = borrowed_state<float>(st[8], shapes[8], f[8], r[8]);
  v.sink_v = borrowed_state<float>(st[9], shapes[9], f[9], r[9]);
  v.sink_pos = borrowed_state<int64_t>(st[10], shapes[10], f[10], r[10]);
  return v;
}

}  // namespace

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
      .def_property_readonly("sinks", [](PyHybrid& s) { return s.decoder.sinks(); })
      .def_property_readonly("features", [](PyHybrid& s) { return s.decoder.features(); })
      .def(
          "step_state",
          [](PyHybrid& self, const py::tuple& state, const py::handle& q, const py::handle& k,
             const py::handle& v, const py::handle& key_mask, const std::string& mode) {
            const HybridDecoderStateView st = borrowed_hybrid_state(self.decoder, state);
            return run_mode(self, st, q, k, v, key_mask, mode,
                            [&](TensorView qv, MutableTensorView out) {
                              self.decoder.query(st, qv, out);
                            });
          },
          py::arg("state"), py::arg("q"), py::arg("k"), py::arg("v"),
          py::arg("key_mask") = py::none(), py::arg("mode") = "step",
          "The functional hybrid decoder (favor::hybrid_decode_step): the state, a tuple of "
          "arrays in hybrid_state_layout's order (C-contiguous, writeable, each of its dtype), "
          "advanced in place and y [B, H, T, Dv] returned; this decoder lends its map only. "
          "mode as Decoder.step_state's.")
      .def(
          "state",
          [](PyHybrid& self) {
            HybridDecoderState st;
            {
              std::lock_guard<std::mutex> lock(self.mutex);
              st = self.decoder.state();
            }
            const auto shapes = hybrid_shapes(self.decoder, st.batch);
            py::dict d;
            d["sums"] = state_array(st.linear.sums, shapes[0]);
            d["log_max"] = state_array(st.linear.log_max, shapes[1]);
            d["row_positions"] = state_array(st.linear.row_positions, shapes[2]);
            d["position"] = st.position;
            d["ring_k"] = state_array(st.ring_k, shapes[4]);
            d["ring_v"] = state_array(st.ring_v, shapes[5]);
            d["ring_keep"] = state_array(st.ring_keep, shapes[6]);
            d["ring_sink"] = state_array(st.ring_sink, shapes[7]);
            d["sink_k"] = state_array(st.sink_k, shapes[8]);
            d["sink_v"] = state_array(st.sink_v, shapes[9]);
            d["sink_pos"] = state_array(st.sink_pos, shapes[10]);
            return d;
          },
          "A copy of the state: the linear state (sums, log_max, row_positions, as "
          "Decoder.state()), 'position' (tokens seen, an int), the ring (ring_k, ring_v, "
          "ring_keep, ring_sink: uint8 0 or 1) and the sinks (sink_k, sink_v, sink_pos: -1 "
          "where none yet); hybrid_state_layout gives the shapes.")
      .def(
          "load_state",
          [](PyHybrid& self, const py::handle& sums, const py::handle& log_max,
             const py::handle& row_positions, int64_t position, const py::handle& ring_k,
             const py::handle& ring_v, const py::handle& ring_keep, const py::handle& ring_sink,
             const py::handle& sink_k, const py::handle& sink_v, const py::handle& sink_pos) {
            std::lock_guard<std::mutex> lock(self.mutex);
            const HybridDecoder& dec = self.decoder;
            const auto shapes = hybrid_shapes(dec, dec.batch());
            HybridDecoderState st;
            st.batch = dec.batch();
            st.heads = dec.heads();
            st.d = dec.d();
            st.dv = dec.dv();
            st.window = dec.window();
            st.sinks = dec.sinks();
            st.position = position;
            st.linear = DecoderState{st.batch, st.heads, dec.features(), st.dv,
                                     std::max<int64_t>(position - st.window, 0), {}, {}, {}};
            const char* const* rule = kHybridRules;
            state_input(sums, shapes[0], "sums", rule[0], st.linear.sums);
            state_input(log_max, shapes[1], "log_max", rule[1], st.linear.log_max);
            state_input(row_positions, shapes[2], "row_positions", rule[2],
                        st.linear.row_positions);
            state_input(ring_k, shapes[4], "ring_k", rule[4], st.ring_k);
            state_input(ring_v, shapes[5], "ring_v", rule[5], st.ring_v);
            state_input(ring_keep, shapes[6], "ring_keep", rule[6], st.ring_keep);
            state_input(ring_sink, shapes[7], "ring_sink", rule[7], st.ring_sink);
            state_input(sink_k, shapes[8], "sink_k", rule[8], st.sink_k);
            state_input(sink_v, shapes[9], "sink_v", rule[9], st.sink_v);
            state_input(sink_pos, shapes[10], "sink_pos", rule[10], st.sink_pos);
            self.decoder.load_state(st);
          },
          py::arg("sums"), py::arg("log_max"), py::arg("row_positions"), py::arg("position"),
          py::arg("ring_k"), py::arg("ring_v"), py::arg("ring_keep"), py::arg("ring_sink"),
          py::arg("sink_k"), py::arg("sink_v"), py::arg("sink_pos"),
          "Replaces the state by arrays shaped as state() returns them (load_state(**state())); "
          "shapes and values are checked (HybridDecoder::load_state), favor.Error naming the "
          "field otherwise.");
  m.def(
      "hybrid_state_layout",
      [](int64_t batch, int64_t heads, int64_t features, int64_t d, int64_t dv, int64_t window,
         int64_t sinks) {
        py::list out;
        const auto shapes = hybrid_shapes(batch, heads, features, d, dv, window, sinks);
        for (size_t i = 0; i < shapes.size(); ++i)
          out.append(py::make_tuple(kHybridFields[i], shapes[i], kHybridDtypes[i]));
        return out;
      },
      py::arg("batch"), py::arg("heads"), py::arg("features"), py::arg("d"), py::arg("dv"),
      py::arg("window"), py::arg("sinks"),
      "The hybrid decoding state's fields in order, each (name, shape, dtype): the C++ "
      "HybridDecoderState's layout (favor/hybrid_decoder.hpp), the plain decoder's four first "
      "(position [1]: the tokens seen), then the ring and the sinks.");
}

}  // namespace favor::python
