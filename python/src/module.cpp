// favor._core: the pybind11 extension under the favor Python package. Thin by design:
// every rule is checked by the C++ library, whose favor::Error becomes favor.Error
// (a ValueError); the GIL is released while favor computes.
#include <pybind11/pybind11.h>

#include "bindings.hpp"
#include "favor/favor.hpp"

PYBIND11_MODULE(_core, m) {
  m.doc() = "favor's C++ core; use the favor package, which documents every function.";
  pybind11::register_exception<favor::Error>(m, "Error", PyExc_ValueError);
  m.attr("__version__") = FAVOR_VERSION_STRING;
  favor::python::bind_projection(m);
  favor::python::bind_attention(m);
  favor::python::bind_feature_map(m);
  favor::python::bind_decoder(m);
  favor::python::bind_fit(m);
  favor::python::bind_runtime(m);
  favor::python::bind_vq(m);  // adds to the reference submodule bind_runtime made
  favor::python::bind_exchange(m);
  favor::python::bind_sequence_parallel(m);
  favor::python::bind_rules(m);
}
