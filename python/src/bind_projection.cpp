// favor.Projection, favor.KernelFit, fit_kernel and optimal_a.
#include <pybind11/stl.h>

#include <cstring>

#include "arrays.hpp"
#include "bindings.hpp"

namespace favor::python {
namespace {

Projection draw(int64_t m, int64_t d, const std::string& kind, const std::string& norms,
                uint64_t seed) {
  ProjectionOptions o;
  o.kind = parse_projection_kind(kind, "kind");
  o.norms = parse_norm_mode(norms, "norms");
  o.seed = seed;
  return Projection::draw(m, d, o);
}

Projection from_matrix(const py::handle& obj) {
  py::array a = py::array::ensure(obj);
  if (!a || a.ndim() != 2) throw Error("matrix: must be a 2-D [m, d] float array");
  if (a.dtype().kind() != 'f') {
    throw Error("matrix: dtype " + py::str(a.dtype()).cast<std::string>() + " is not a float type");
  }
  auto c = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(a);
  std::vector<float> values(static_cast<size_t>(c.size()));
  if (!values.empty()) std::memcpy(values.data(), c.data(), sizeof(float) * values.size());
  return Projection::from_matrix(a.shape(0), a.shape(1), std::move(values));
}

py::array_t<float> matrix_view(const Projection& w, py::handle owner) {
  py::array_t<float> a({w.m(), w.d()}, {w.d() * 4, int64_t{4}}, w.data(), owner);
  py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return a;
}

py::array_t<double> copy_doubles(const std::vector<double>& v, std::vector<py::ssize_t> shape) {
  py::array_t<double> a(shape);
  if (!v.empty()) std::memcpy(a.mutable_data(), v.data(), sizeof(double) * v.size());
  return a;
}

KernelFit make_fit(const py::handle& a_obj, const py::handle& basis_obj) {
  auto a = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(a_obj);
  auto basis = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(basis_obj);
  if (!a || a.ndim() != 2) throw Error("a: must be a 2-D [heads, d] float array");
  if (!basis || basis.ndim() != 3 || basis.shape(0) != a.shape(0) || basis.shape(1) != a.shape(1) ||
      basis.shape(2) != a.shape(1)) {
    throw Error("basis: must be a [heads, d, d] float array matching a [heads, d]");
  }
  KernelFit f;
  f.heads = a.shape(0);
  f.d = a.shape(1);
  f.a.assign(a.data(), a.data() + a.size());
  f.basis.assign(basis.data(), basis.data() + basis.size());
  return f;
}

}  // namespace

void bind_projection(py::module_& m) {
  py::class_<Projection>(m, "Projection")
      .def_static("draw", &draw, py::arg("m"), py::arg("d"), py::arg("kind") = "orthogonal",
                  py::arg("norms") = "chi", py::arg("seed") = 0)
      .def_static("from_matrix", &from_matrix, py::arg("matrix"))
      .def("redraw", &Projection::redraw, py::arg("seed"))
      .def_property_readonly("m", &Projection::m)
      .def_property_readonly("d", &Projection::d)
      .def_property_readonly("kind",
                             [](const Projection& w) { return to_string(w.options().kind); })
      .def_property_readonly("norms",
                             [](const Projection& w) { return to_string(w.options().norms); })
      .def_property_readonly("seed", [](const Projection& w) { return w.options().seed; })
      .def_property_readonly("imported", &Projection::imported)
      .def_property_readonly(
          "matrix",
          [](py::object self) { return matrix_view(self.cast<const Projection&>(), self); })
      .def(py::pickle(
          [](py::object self) {
            const auto& w = self.cast<const Projection&>();
            return py::make_tuple(w.imported(), w.m(), w.d(), to_string(w.options().kind),
                                  to_string(w.options().norms), w.options().seed,
                                  w.imported() ? py::object(matrix_view(w, self).attr("copy")())
                                               : py::object(py::none()));
          },
          [](const py::tuple& t) {
            if (t.size() != 7) throw Error("Projection: not a pickled favor.Projection");
            if (t[0].cast<bool>()) return from_matrix(t[6]);
            return draw(t[1].cast<int64_t>(), t[2].cast<int64_t>(), t[3].cast<std::string>(),
                        t[4].cast<std::string>(), t[5].cast<uint64_t>());
          }));

  py::class_<KernelFit>(m, "KernelFit")
      .def(py::init(&make_fit), py::arg("a"), py::arg("basis"))
      .def_static("constant", &KernelFit::constant, py::arg("a"), py::arg("d"))
      .def_readonly("heads", &KernelFit::heads)
      .def_readonly("d", &KernelFit::d)
      .def_property_readonly("a",
                             [](const KernelFit& f) {
                               return copy_doubles(f.a, {f.heads, f.d});
                             })
      .def_property_readonly("basis",
                             [](const KernelFit& f) {
                               return copy_doubles(f.basis, {f.heads, f.d, f.d});
                             })
      .def(py::pickle(
          [](const KernelFit& f) {
            return py::make_tuple(copy_doubles(f.a, {f.heads, f.d}),
                                  copy_doubles(f.basis, {f.heads, f.d, f.d}));
          },
          [](const py::tuple& t) { return make_fit(t[0], t[1]); }));

  m.def(
      "fit_kernel",
      [](const std::string& kernel, const py::handle& q, const py::handle& k,
         std::optional<double> scale, const py::handle& key_mask) {
        const Kernel kern = parse_kernel(kernel, "kernel");
        const Input qi = as_input(q, "q"), ki = as_input(k, "k");
        check_same_rank({&qi, &ki}, "q, k");
        const auto mask =
            as_mask(key_mask, ki.rank, ki.view.shape[0], ki.view.shape[2], "key_mask");
        std::optional<KeyMaskView> mv;
        if (mask) mv = mask->view;
        py::gil_scoped_release release;
        return fit_kernel(kern, qi.view, ki.view, scale, mv);
      },
      py::arg("kernel"), py::arg("q"), py::arg("k"), py::arg("scale") = py::none(),
      py::arg("key_mask") = py::none());
  m.def("optimal_a", &optimal_a, py::arg("rho"));
}

}  // namespace favor::python
