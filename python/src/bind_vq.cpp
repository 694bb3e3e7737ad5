// Transformer-VQ: vq_attention(_backward), vq_assign, the commitment loss, codebook learning
// (k-means, EMA updates on caller-owned numpy buffers), VQDecoder and the double reference.
// Codebooks are [c, D] (shared by all heads) or [H or 1, c, D], converted as vq_call.hpp says.
#include <pybind11/stl.h>

#include <cstring>

#include "arrays.hpp"
#include "bindings.hpp"
#include "decoder_binding.hpp"
#include "vq_call.hpp"

namespace favor::python {
namespace {

/// One of the [B, H, N] per-key results (codes, distances) in the rank of k.
template <typename T>
py::array_t<T> per_key(const Input& k) {
  const Shape4& s = k.view.shape;
  if (k.rank == 2) return py::array_t<T>({s[2]});
  return py::array_t<T>({s[0], s[1], s[2]});
}

/// A caller-owned state buffer: the right dtype, C-contiguous, writable, the given shape.
template <typename T>
T* state_buffer(const py::handle& obj, const std::vector<int64_t>& shape, const char* dtype,
                const std::string& name) {
  if (!py::isinstance<py::array>(obj)) throw Error(name + ": must be a numpy array");
  auto a = py::reinterpret_borrow<py::array>(obj);
  if (!a.dtype().is(py::dtype::of<T>())) {
    throw Error(name + ": dtype " + py::str(a.dtype()).cast<std::string>() + " must be " + dtype +
                " (it is updated in place)");
  }
  bool same = a.ndim() == static_cast<py::ssize_t>(shape.size());
  for (size_t i = 0; same && i < shape.size(); ++i) same = a.shape(i) == shape[i];
  if (!same) {
    std::string want = "[";
    for (size_t i = 0; i < shape.size(); ++i) want += (i ? ", " : "") + std::to_string(shape[i]);
    throw Error(name + ": shape must be " + want + "] (that of the codebook)");
  }
  if (!(a.flags() & py::array::c_style)) throw Error(name + ": must be C-contiguous");
  if (!a.writeable()) throw Error(name + ": is read-only; it is updated in place");
  return static_cast<T*>(a.mutable_data());
}

void bind_functions(py::module_& m) {
  m.def(
      "vq_attention",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const py::handle& codebook,
         bool causal, std::optional<double> scale, const py::handle& key_mask, double tau,
         int64_t block) {
        const VQCall c = vq_inputs(q, k, v, codebook, causal, scale, key_mask, tau, block);
        const Shape4 shape = c.output_shape();
        py::array_t<float> y = new_output(shape, c.q.rank);
        const MutableTensorView out = output_view(y, shape);
        VQStats stats;
        {
          py::gil_scoped_release release;
          stats = vq_attention(c.q.view, c.k.view, c.v.view, c.codebook.view, out, c.options);
        }
        return py::make_tuple(y, stats.zero_rows);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("codebook"), py::arg("causal") = false,
      py::arg("scale") = py::none(), py::arg("key_mask") = py::none(), py::arg("tau") = 0.0,
      py::arg("block") = 0);

  m.def(
      "vq_attention_backward",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const py::handle& dy,
         const py::handle& codebook, bool causal, std::optional<double> scale,
         const py::handle& key_mask, double tau, int64_t block, bool codebook_grad) {
        const VQCall c = vq_inputs(q, k, v, codebook, causal, scale, key_mask, tau, block);
        const Input g = c.gradient(dy);
        VQGrads grads;
        {
          py::gil_scoped_release release;
          grads = vq_attention_backward(c.q.view, c.k.view, c.v.view, g.view, c.codebook.view,
                                        c.options, codebook_grad);
        }
        return c.grads_tuple(std::move(grads), codebook_grad);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("dy"), py::arg("codebook"),
      py::arg("causal") = false, py::arg("scale") = py::none(), py::arg("key_mask") = py::none(),
      py::arg("tau") = 0.0, py::arg("block") = 0, py::arg("codebook_grad") = false);

  m.def(
      "vq_assign",
      [](const py::handle& k, const py::handle& codebook, bool distances) {
        const Input ki = as_input(k, "k");
        const CodebookInput cb = as_codebook(codebook, "codebook");
        py::array_t<int32_t> codes = per_key<int32_t>(ki);
        py::object dist = py::none();
        float* dist_data = nullptr;
        if (distances) {
          py::array_t<float> d = per_key<float>(ki);
          dist_data = d.mutable_data();
          dist = d;
        }
        int32_t* codes_data = codes.mutable_data();
        {
          py::gil_scoped_release release;
          vq_assign(ki.view, cb.view, codes_data, dist_data);
        }
        return py::make_tuple(codes, dist);
      },
      py::arg("k"), py::arg("codebook"), py::arg("distances") = false);

  m.def(
      "commitment_loss",
      [](const py::handle& k, const py::handle& codebook, double beta, const py::handle& key_mask) {
        const Input ki = as_input(k, "k");
        const CodebookInput cb = as_codebook(codebook, "codebook");
        const auto mask =
            as_mask(key_mask, ki.rank, ki.view.shape[0], ki.view.shape[2], "key_mask");
        Commitment r;
        {
          py::gil_scoped_release release;
          r = commitment_loss(ki.view, cb.view, beta, mask_view(mask));
        }
        return py::make_tuple(r.loss, to_array(std::move(r.dk), ki.rank));
      },
      py::arg("k"), py::arg("codebook"), py::arg("beta") = 0.25, py::arg("key_mask") = py::none());

  m.def(
      "codebook_ema_update",
      [](const py::handle& codebook, const py::handle& ema_sum, const py::handle& ema_count,
         const py::handle& unused, const py::handle& k, double decay, int64_t dead_after,
         double eps, uint64_t seed, const py::handle& key_mask) {
        if (!py::isinstance<py::array>(codebook)) throw Error("codebook: must be a numpy array");
        const auto cb = py::reinterpret_borrow<py::array>(codebook);
        if (cb.ndim() != 3) {
          throw Error("codebook: has rank " + std::to_string(cb.ndim()) +
                      "; the EMA state is [H or 1, c, D]");
        }
        const int64_t hc = cb.shape(0), c = cb.shape(1), d = cb.shape(2);
        CodebookState state{state_buffer<float>(codebook, {hc, c, d}, "float32", "codebook"),
                            state_buffer<float>(ema_sum, {hc, c, d}, "float32", "ema_sum"),
                            state_buffer<float>(ema_count, {hc, c}, "float32", "ema_count"),
                            state_buffer<int64_t>(unused, {hc, c}, "int64", "unused"),
                            hc,
                            c,
                            d};
        const Input ki = as_input(k, "k");
        const auto mask =
            as_mask(key_mask, ki.rank, ki.view.shape[0], ki.view.shape[2], "key_mask");
        EMAOptions o;
        o.decay = decay;
        o.dead_after = dead_after;
        o.eps = eps;
        py::gil_scoped_release release;
        return codebook_ema_update(state, ki.view, o, seed, mask_view(mask));
      },
      py::arg("codebook"), py::arg("ema_sum"), py::arg("ema_count"), py::arg("unused"),
      py::arg("k"), py::arg("decay") = 0.99, py::arg("dead_after") = 50, py::arg("eps") = 1e-5,
      py::arg("seed") = 0, py::arg("key_mask") = py::none());

  m.def(
      "codebook_kmeans",
      [](const py::handle& k, int64_t codes, int64_t iterations, uint64_t seed, bool per_head,
         const py::handle& key_mask) {
        const Input ki = as_input(k, "k");
        const auto mask =
            as_mask(key_mask, ki.rank, ki.view.shape[0], ki.view.shape[2], "key_mask");
        std::vector<double> history;
        KMeansOptions o;
        o.iterations = iterations;
        o.seed = seed;
        // Runs without the GIL: the callback only records, Python prints afterwards.
        o.on_iteration = [&history](int64_t, double error) { history.push_back(error); };
        std::optional<Codebook> book;
        {
          py::gil_scoped_release release;
          book.emplace(Codebook::kmeans(ki.view, codes, o, per_head, mask_view(mask)));
        }
        py::array_t<float> values({book->heads(), book->codes(), book->d()});
        std::memcpy(values.mutable_data(), book->values().data(),
                    sizeof(float) * book->values().size());
        return py::make_tuple(values, history);
      },
      py::arg("k"), py::arg("codes"), py::arg("iterations") = 25, py::arg("seed") = 0,
      py::arg("per_head") = true, py::arg("key_mask") = py::none());
}

void bind_vq_decoder(py::module_& m) {
  using PyVQDecoder = Locked<VQDecoder>;
  bind_streaming_decoder<VQDecoder>(m, "VQDecoder")
      .def(py::init([](int64_t batch, int64_t heads, int64_t dv, const py::handle& codebook,
                       std::optional<double> scale, double tau) {
             const CodebookInput cb = as_codebook(codebook, "codebook");
             VQDecoderOptions o;
             o.scale = scale;
             o.tau = tau;
             return new PyVQDecoder{VQDecoder(batch, heads, dv, cb.view, o), {}};
           }),
           py::arg("batch"), py::arg("heads"), py::arg("dv"), py::arg("codebook"),
           py::arg("scale") = py::none(), py::arg("tau") = 0.0)
      .def_property_readonly("codes", [](PyVQDecoder& s) { return s.decoder.codes(); })
      .def(
          "step_state",
          [](PyVQDecoder& self, const py::handle& sums, const py::handle& counts,
             const py::handle& position, const py::handle& q, const py::handle& k,
             const py::handle& v, const py::handle& key_mask, const std::string& mode) {
            const VQDecoder& dec = self.decoder;
            const int64_t B = dec.batch(), H = dec.heads(), c = dec.codes(), Dv = dec.dv();
            VQDecoderStateView st;
            st.sums =
                borrowed_state<float>(sums, {B, H, c, Dv}, "sums", "[batch, heads, codes, dv]");
            st.counts = borrowed_state<float>(counts, {B, H, c}, "counts", "[batch, heads, codes]");
            st.position = borrowed_state<int64_t>(position, {1}, "position", "[1]");
            return run_mode(self, st, q, k, v, key_mask, mode,
                            [&](TensorView qv, MutableTensorView out) {
                              self.decoder.query(st.sums, st.counts, qv, out);
                            });
          },
          py::arg("sums"), py::arg("counts"), py::arg("position"), py::arg("q"), py::arg("k"),
          py::arg("v"), py::arg("key_mask") = py::none(), py::arg("mode") = "step",
          "The functional VQ decoder (favor::vq_decode_step): the state given as arrays "
          "(float32 sums [B, H, c, Dv], float32 counts [B, H, c], int64 position [1], "
          "C-contiguous, writeable) is advanced in place and y [B, H, T, Dv] returned; mode as "
          "Decoder.step_state's.")
      .def(
          "state",
          [](PyVQDecoder& self) {
            VQDecoderState st;
            {
              std::lock_guard<std::mutex> lock(self.mutex);
              st = self.decoder.state();
            }
            py::dict d;
            d["sums"] = state_array(st.sums, {st.batch, st.heads, st.codes, st.dv});
            d["counts"] = state_array(st.counts, {st.batch, st.heads, st.codes});
            d["position"] = st.position;
            return d;
          },
          "A copy of the state: {'sums': float32 [B, H, c, Dv] (per code, the sum of its keys' "
          "values), 'counts': float32 [B, H, c] (per code, its key count), 'position': int}.")
      .def(
          "load_state",
          [](PyVQDecoder& self, const py::handle& sums, const py::handle& counts,
             int64_t position) {
            std::lock_guard<std::mutex> lock(self.mutex);
            const VQDecoder& dec = self.decoder;
            const int64_t B = dec.batch(), H = dec.heads(), c = dec.codes(), Dv = dec.dv();
            VQDecoderState st{B, H, c, Dv, position, {}, {}};
            state_input(sums, {B, H, c, Dv}, "sums", "[batch, heads, codes, dv]", st.sums);
            state_input(counts, {B, H, c}, "counts", "[batch, heads, codes]", st.counts);
            self.decoder.load_state(st);
          },
          py::arg("sums"), py::arg("counts"), py::arg("position"),
          "Replaces the state by arrays shaped as state() returns them (load_state(**state())); "
          "shapes and values are checked, favor.Error naming the argument otherwise.");
}

void bind_reference(py::module_& m) {
  py::module_ ref = m.attr("reference").cast<py::module_>();
  ref.def(
      "vq_attention",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const py::handle& codebook,
         bool causal, std::optional<double> scale, const py::handle& key_mask, double tau) {
        const VQCall c = vq_inputs(q, k, v, codebook, causal, scale, key_mask, tau, 0);
        return to_array(
            reference::vq_attention(c.q.view, c.k.view, c.v.view, c.codebook.view, c.options),
            c.q.rank);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("codebook"), py::arg("causal") = false,
      py::arg("scale") = py::none(), py::arg("key_mask") = py::none(), py::arg("tau") = 0.0);
  ref.def(
      "vq_attention_backward",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const py::handle& dy,
         const py::handle& codebook, bool causal, std::optional<double> scale,
         const py::handle& key_mask, double tau) {
        const VQCall c = vq_inputs(q, k, v, codebook, causal, scale, key_mask, tau, 0);
        const Input g = c.gradient(dy);
        reference::DGrads r = reference::vq_attention_backward(c.q.view, c.k.view, c.v.view, g.view,
                                                               c.codebook.view, c.options);
        const Shape4& s = c.codebook.view.shape;
        py::array_t<double> dc = c.codebook.rank == 2 ? py::array_t<double>({s[2], s[3]})
                                                      : py::array_t<double>({s[1], s[2], s[3]});
        if (!r.dw.empty())
          std::memcpy(dc.mutable_data(), r.dw.data(), sizeof(double) * r.dw.size());
        return py::make_tuple(to_array(r.dq, c.q.rank), to_array(r.dk, c.q.rank),
                              to_array(r.dv, c.q.rank), dc);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("dy"), py::arg("codebook"),
      py::arg("causal") = false, py::arg("scale") = py::none(), py::arg("key_mask") = py::none(),
      py::arg("tau") = 0.0);
  ref.def(
      "vq_assign",
      [](const py::handle& k, const py::handle& codebook) {
        const Input ki = as_input(k, "k");
        const CodebookInput cb = as_codebook(codebook, "codebook");
        const std::vector<int32_t> z = reference::vq_assign(ki.view, cb.view);
        py::array_t<int32_t> codes = per_key<int32_t>(ki);
        std::memcpy(codes.mutable_data(), z.data(), sizeof(int32_t) * z.size());
        return codes;
      },
      py::arg("k"), py::arg("codebook"));
}

}  // namespace

void bind_vq(py::module_& m) {
  bind_functions(m);
  bind_vq_decoder(m);
  bind_reference(m);
}

}  // namespace favor::python
