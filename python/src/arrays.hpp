#pragma once
// numpy arrays <-> favor views. float32 arrays are viewed in place (any non-negative,
// element-aligned strides); other float dtypes, negative strides and misaligned data are
// copied once to C-contiguous float32. Rank 2 [N, D] is one head, rank 4 [B, H, N, D].
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "favor/favor.hpp"

namespace favor::python {

namespace py = pybind11;

/// An input tensor: the view and the array that owns (or keeps alive) its memory.
struct Input {
  py::array keep;
  TensorView view;
  int rank = 4;
  bool copied = false;
};

/// Views (or converts) `obj` as a rank-2 or rank-4 float32 tensor; throws favor::Error
/// naming `name` for other ranks and non-float dtypes.
Input as_input(const py::handle& obj, const std::string& name);
/// Checks that every input shares the first's rank (2 or 4).
void check_same_rank(std::initializer_list<const Input*> inputs, const std::string& names);

/// A key mask [B, Nk] (rank-4 inputs) or [Nk] (rank-2 inputs), nonzero = the key takes part.
/// bool/uint8/int8 arrays are viewed in place, wider integers converted.
struct Mask {
  py::array keep;
  KeyMaskView view;
};
std::optional<Mask> as_mask(const py::handle& obj, int rank, int64_t batch, int64_t nk,
                            const std::string& name);
/// The view of a mask from as_mask, or none.
std::optional<KeyMaskView> mask_view(const std::optional<Mask>& mask);

/// A new C-contiguous float32 array of the given [B, H, N, X] shape, returned in `rank`.
py::array_t<float> new_output(const Shape4& shape, int rank);
/// The writable view of an array made by new_output.
MutableTensorView output_view(py::array_t<float>& out, const Shape4& shape);
/// A favor::Tensor handed to numpy without a copy, in the given rank.
py::array_t<float> to_array(Tensor&& t, int rank);
/// A vector handed to numpy without a copy, in the given shape.
py::array_t<float> to_array(std::vector<float>&& v, std::vector<py::ssize_t> shape);
/// A double-precision reference result [B, H, N, X], copied to numpy in the given rank.
py::array_t<double> to_array(const reference::DTensor& t, int rank);

}  // namespace favor::python
