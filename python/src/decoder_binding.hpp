#pragma once
// What favor.Decoder and favor.VQDecoder share: the GIL is released while a decoder
// computes, so a mutex keeps two Python threads from using one decoder at once (neither
// favor::Decoder nor favor::VQDecoder is thread-safe). The state arrays cross as numpy
// arrays (state_array, state_input); favor::detail checks them against the decoder.
#include <pybind11/stl.h>

#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "arrays.hpp"

namespace favor::python {

/// A streaming decoder as Python holds it: the decoder and the mutex that serialises calls.
template <typename D>
struct Locked {
  D decoder;
  std::mutex mutex;
};

/// A state vector copied into a new numpy array of the given shape.
template <typename T>
py::array_t<T> state_array(const std::vector<T>& values, const std::vector<py::ssize_t>& shape) {
  py::array_t<T> a(shape);
  std::memcpy(a.mutable_data(), values.data(), sizeof(T) * values.size());
  return a;
}

/// A state argument's shape against `shape` (`rule` names the extents in the message).
inline void check_state_shape(const py::array& a, const std::vector<py::ssize_t>& shape,
                              const char* name, const char* rule) {
  bool ok = a.ndim() == static_cast<py::ssize_t>(shape.size());
  for (py::ssize_t i = 0; ok && i < a.ndim(); ++i) ok = a.shape(i) == shape[size_t(i)];
  if (ok) return;
  std::string got = "[";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) got += (i > 0 ? "," : "") + std::to_string(a.shape(i));
  throw Error(std::string(name) + ": shape " + got + "] must be " + rule);
}

/// A state argument `name` read as a C-contiguous array of T whose shape must be `shape`
/// (`rule` names the extents in the message); its values are copied into `values`.
template <typename T>
void state_input(const py::handle& obj, const std::vector<py::ssize_t>& shape, const char* name,
                 const char* rule, std::vector<T>& values) {
  const auto a = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(obj);
  if (!a) throw Error(std::string(name) + ": cannot be read as an array");
  check_state_shape(a, shape, name, rule);
  values.assign(a.data(), a.data() + a.size());
}

/// The memory of a state argument `name` that a functional decoder call writes in place:
/// a numpy array of exactly T, C-contiguous and writeable, of shape `shape` (`rule` names the
/// extents in the message).
template <typename T>
T* borrowed_state(const py::handle& obj, const std::vector<py::ssize_t>& shape, const char* name,
                  const char* rule) {
  if (!py::isinstance<py::array_t<T>>(obj))
    throw Error(std::string(name) + ": must be a numpy array of " +
                py::str(py::dtype::of<T>()).cast<std::string>() + " (the state's own dtype)");
  auto a = py::reinterpret_borrow<py::array>(obj);
  if (!(a.flags() & py::array::c_style) || !a.writeable())
    throw Error(std::string(name) +
                ": must be C-contiguous and writeable (it is updated in place)");
  check_state_shape(a, shape, name, rule);
  return static_cast<T*>(a.mutable_data());
}

/// An append of k, v and a key mask: append(k, v, mask) with the GIL released.
template <typename D, class Append>
void run_append(Locked<D>& self, const py::handle& k, const py::handle& v,
                const py::handle& key_mask, Append append) {
  const Input ki = as_input(k, "k"), vi = as_input(v, "v");
  check_same_rank({&ki, &vi}, "k, v");
  const std::optional<Mask> mask =
      as_mask(key_mask, ki.rank, ki.view.shape[0], ki.view.shape[2], "key_mask");
  const std::optional<KeyMaskView> mv = mask_view(mask);
  py::gil_scoped_release release;
  std::lock_guard<std::mutex> lock(self.mutex);
  append(ki.view, vi.view, mv);
}

/// A call of the decoder on q, k, v and a key mask that writes [B, H, T, Dv] (step, prefill):
/// call(q, k, v, out, mask) with the GIL released.
template <typename D, class Call>
py::array_t<float> run_qkv(Locked<D>& self, const py::handle& q, const py::handle& k,
                           const py::handle& v, const py::handle& key_mask, Call call) {
  const Input qi = as_input(q, "q"), ki = as_input(k, "k"), vi = as_input(v, "v");
  check_same_rank({&qi, &ki, &vi}, "q, k, v");
  const std::optional<Mask> mask =
      as_mask(key_mask, ki.rank, ki.view.shape[0], ki.view.shape[2], "key_mask");
  const Shape4 shape{qi.view.shape[0], qi.view.shape[1], qi.view.shape[2], self.decoder.dv()};
  py::array_t<float> y = new_output(shape, qi.rank);
  MutableTensorView out = output_view(y, shape);
  TensorView qv = qi.view, kv = ki.view, vv = vi.view;
  std::optional<KeyMaskView> mv = mask_view(mask);
  {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(self.mutex);
    call(qv, kv, vv, out, mv);
  }
  return y;
}

/// A functional decoder call on a borrowed state view st (Decoder's or VQDecoder's): mode
/// 'step' (T = 1, fused), 'prefill' (causal over T tokens), 'append_query', 'append' (k, v;
/// an empty y) or 'query' (q; query(q, out) reads the state).
template <typename D, typename View, class Query>
py::array_t<float> run_mode(Locked<D>& self, View st, const py::handle& q, const py::handle& k,
                            const py::handle& v, const py::handle& key_mask,
                            const std::string& mode, Query query) {
  const int64_t B = self.decoder.batch(), H = self.decoder.heads(), Dv = self.decoder.dv();
  if (mode == "step") {
    return run_qkv(self, q, k, v, key_mask, [&](auto&... args) { self.decoder.step(st, args...); });
  }
  if (mode == "prefill") {
    return run_qkv(self, q, k, v, key_mask,
                   [&](auto&... args) { self.decoder.prefill(st, args...); });
  }
  if (mode == "append") {
    run_append(self, k, v, key_mask, [&](auto&... args) { self.decoder.append(st, args...); });
    return py::array_t<float>(std::vector<py::ssize_t>{B, H, 0, Dv});
  }
  if (mode == "query") {
    const Input qi = as_input(q, "q");
    const Shape4 shape{qi.view.shape[0], qi.view.shape[1], qi.view.shape[2], Dv};
    py::array_t<float> y = new_output(shape, qi.rank);
    const MutableTensorView out = output_view(y, shape);
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(self.mutex);
    query(qi.view, out);
    return y;
  }
  if (mode != "append_query")
    throw Error("mode: '" + mode + "' must be step, append, query, append_query or prefill");
  return run_qkv(self, q, k, v, key_mask,
                 [&](TensorView qv, TensorView kv, TensorView vv, MutableTensorView out,
                     const std::optional<KeyMaskView>& mask) {
                   self.decoder.append(st, kv, vv, mask);
                   query(qv, out);
                 });
}

/// The class `name` with append(k, v, key_mask), query(q), step and prefill(q, k, v, key_mask),
/// reset(), select(indices) and the properties position, batch, heads, dv and state_bytes; the
/// caller adds the constructor, state() and load_state() and what differs.
template <typename D>
py::class_<Locked<D>> bind_streaming_decoder(py::module_& m, const char* name) {
  using Self = Locked<D>;
  py::class_<Self> cls(m, name);
  cls.def(
         "append",
         [](Self& self, const py::handle& k, const py::handle& v, const py::handle& key_mask) {
           run_append(self, k, v, key_mask, [&](auto&... args) { self.decoder.append(args...); });
         },
         py::arg("k"), py::arg("v"), py::arg("key_mask") = py::none(),
         "Appends T tokens k [B, H, T, D], v [B, H, T, Dv]; key_mask [B, T] (nonzero = the "
         "token takes part): a masked token leaves its row's state as it was (no key, no "
         "decay step).")
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
      .def(
          "step",
          [](Self& self, const py::handle& q, const py::handle& k, const py::handle& v,
             const py::handle& key_mask) {
            return run_qkv(self, q, k, v, key_mask,
                           [&](auto&... args) { self.decoder.step(args...); });
          },
          py::arg("q"), py::arg("k"), py::arg("v"), py::arg("key_mask") = py::none(),
          "One decode step of every row, fused: append(k, v, key_mask) then query(q) with "
          "q, k [B, H, 1, D], v [B, H, 1, Dv], key_mask [B, 1]; returns [B, H, 1, Dv].")
      .def(
          "prefill",
          [](Self& self, const py::handle& q, const py::handle& k, const py::handle& v,
             const py::handle& key_mask) {
            return run_qkv(self, q, k, v, key_mask,
                           [&](auto&... args) { self.decoder.prefill(args...); });
          },
          py::arg("q"), py::arg("k"), py::arg("v"), py::arg("key_mask") = py::none(),
          "Causal attention over a prompt q, k [B, H, T, D], v [B, H, T, Dv] (key_mask [B, T]) "
          "from the current state, returned [B, H, T, Dv]; leaves the state append(k, v, "
          "key_mask) leaves, computing the key features (codes) once.")
      .def("reset",
           [](Self& self) {
             std::lock_guard<std::mutex> lock(self.mutex);
             self.decoder.reset();
           })
      .def(
          "select",
          [](Self& self, const std::vector<int64_t>& indices) {
            std::lock_guard<std::mutex> lock(self.mutex);
            self.decoder.select(indices);
          },
          py::arg("indices"),
          "Keeps batch rows indices[0], indices[1], ... in that order (rows may repeat or be "
          "dropped); the new batch is len(indices), as a beam-search cache reorders.")
      .def_property_readonly("position", [](Self& s) { return s.decoder.position(); })
      .def_property_readonly("batch", [](Self& s) { return s.decoder.batch(); })
      .def_property_readonly("heads", [](Self& s) { return s.decoder.heads(); })
      .def_property_readonly("dv", [](Self& s) { return s.decoder.dv(); })
      .def_property_readonly("state_bytes", [](Self& s) { return s.decoder.state_bytes(); });
  return cls;
}

}  // namespace favor::python
