#include "arrays.hpp"

#include <algorithm>
#include <cstring>

namespace favor::python {
namespace {

std::string dtype_name(const py::array& a) {
  return py::str(a.dtype()).cast<std::string>();
}

bool viewable(const py::array& a, int64_t itemsize) {
  if (reinterpret_cast<uintptr_t>(a.data()) % itemsize != 0) return false;
  for (py::ssize_t i = 0; i < a.ndim(); ++i) {
    if (a.shape(i) > 1 && (a.strides(i) < 0 || a.strides(i) % itemsize != 0)) return false;
  }
  return true;
}

Shape4 element_strides(const py::array& a, int64_t itemsize) {
  Shape4 s{0, 0, 0, 0};
  const int offset = 4 - static_cast<int>(a.ndim());
  for (py::ssize_t i = 0; i < a.ndim(); ++i) {
    s[offset + i] = a.shape(i) > 1 ? a.strides(i) / itemsize : 0;
  }
  return s;
}

Shape4 shape4(const py::array& a) {
  Shape4 s{1, 1, 1, 1};
  const int offset = 4 - static_cast<int>(a.ndim());
  for (py::ssize_t i = 0; i < a.ndim(); ++i) s[offset + i] = a.shape(i);
  return s;
}

}  // namespace

Input as_input(const py::handle& obj, const std::string& name) {
  if (obj.is_none()) throw Error(name + ": is None; expected a float array");
  py::array a = py::array::ensure(obj);
  if (!a) throw Error(name + ": cannot be read as an array");
  if (a.ndim() != 2 && a.ndim() != 4) {
    throw Error(name + ": has rank " + std::to_string(a.ndim()) +
                "; must be 2-D [N, D] (one head) or 4-D [B, H, N, D]");
  }
  const char kind = a.dtype().kind();
  if (kind != 'f') {
    throw Error(name + ": dtype " + dtype_name(a) +
                " is not a float type; favor takes float32 (used in place) or float64 (converted)");
  }
  Input in;
  in.rank = static_cast<int>(a.ndim());
  const bool native_f32 = a.dtype().is(py::dtype::of<float>());
  if (native_f32 && viewable(a, sizeof(float))) {
    in.keep = a;
  } else {
    in.keep = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(a);
    if (!in.keep) throw Error(name + ": could not be converted to float32");
    in.copied = true;
  }
  in.view = TensorView{static_cast<const float*>(in.keep.data()), shape4(in.keep),
                       element_strides(in.keep, sizeof(float))};
  return in;
}

void check_same_rank(std::initializer_list<const Input*> inputs, const std::string& names) {
  const int rank = (*inputs.begin())->rank;
  for (const Input* in : inputs) {
    if (in->rank != rank) {
      throw Error(names + ": must all be 2-D [N, D] or all be 4-D [B, H, N, D]");
    }
  }
}

std::optional<Mask> as_mask(const py::handle& obj, int rank, int64_t batch, int64_t nk,
                            const std::string& name) {
  if (obj.is_none()) return std::nullopt;
  py::array a = py::array::ensure(obj);
  if (!a) throw Error(name + ": cannot be read as an array");
  const char kind = a.dtype().kind();
  if (kind != 'b' && kind != 'i' && kind != 'u') {
    throw Error(name + ": dtype " + dtype_name(a) +
                " must be bool or integer (nonzero = the key takes part)");
  }
  const py::ssize_t want_rank = rank == 2 ? 1 : 2;
  const bool shape_ok =
      a.ndim() == want_rank &&
      (want_rank == 1 ? a.shape(0) == nk : a.shape(0) == batch && a.shape(1) == nk);
  if (!shape_ok) {
    std::string got = "[";
    for (py::ssize_t i = 0; i < a.ndim(); ++i) got += (i ? "," : "") + std::to_string(a.shape(i));
    got += "]";
    const std::string want =
        rank == 2 ? "[" + std::to_string(nk) + "] (Nk, for 2-D inputs)"
                  : "[" + std::to_string(batch) + "," + std::to_string(nk) + "] (B, Nk)";
    throw Error(name + ": shape " + got + " must be " + want);
  }
  Mask m;
  if (a.itemsize() == 1 && viewable(a, 1)) {
    m.keep = a;
  } else {
    py::array nonzero = a.attr("__ne__")(0);
    m.keep = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>::ensure(nonzero);
  }
  const auto* data = static_cast<const uint8_t*>(m.keep.data());
  if (want_rank == 1) {
    m.view = KeyMaskView{data, 1, nk, 0, nk > 1 ? m.keep.strides(0) : 1};
  } else {
    m.view = KeyMaskView{data, batch, nk, batch > 1 ? m.keep.strides(0) : 0,
                         nk > 1 ? m.keep.strides(1) : 1};
  }
  return m;
}

std::optional<KeyMaskView> mask_view(const std::optional<Mask>& mask) {
  return mask ? std::optional<KeyMaskView>(mask->view) : std::nullopt;
}

py::array_t<float> new_output(const Shape4& shape, int rank) {
  if (rank == 2) return py::array_t<float>({shape[2], shape[3]});
  return py::array_t<float>({shape[0], shape[1], shape[2], shape[3]});
}

MutableTensorView output_view(py::array_t<float>& out, const Shape4& shape) {
  return MutableTensorView::contiguous(out.mutable_data(), shape);
}

py::array_t<float> to_array(Tensor&& t, int rank) {
  auto* owned = new Tensor(std::move(t));
  py::capsule free_when_done(owned, [](void* p) { delete static_cast<Tensor*>(p); });
  const Shape4& s = owned->shape();
  if (rank == 2) return py::array_t<float>({s[2], s[3]}, owned->data(), free_when_done);
  return py::array_t<float>({s[0], s[1], s[2], s[3]}, owned->data(), free_when_done);
}

py::array_t<float> to_array(std::vector<float>&& v, std::vector<py::ssize_t> shape) {
  auto* owned = new std::vector<float>(std::move(v));
  py::capsule free_when_done(owned, [](void* p) { delete static_cast<std::vector<float>*>(p); });
  return py::array_t<float>(std::move(shape), owned->data(), free_when_done);
}

py::array_t<double> to_array(const reference::DTensor& t, int rank) {
  const Shape4& s = t.shape;
  py::array_t<double> a =
      rank == 2 ? py::array_t<double>({s[2], s[3]}) : py::array_t<double>({s[0], s[1], s[2], s[3]});
  if (!t.values.empty())
    std::memcpy(a.mutable_data(), t.values.data(), sizeof(double) * t.values.size());
  return a;
}

}  // namespace favor::python
