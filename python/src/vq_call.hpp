#pragma once
// What the Transformer-VQ bindings (bind_vq.cpp, and the sequence-parallel ones in
// bind_sequence_parallel.cpp) share: a codebook array viewed as [1, Hc, c, D], q, k, v, the
// key mask and the VQOptions checked and converted, and a codebook gradient handed back in
// the codebook's rank. Codebooks are small, so they are converted to C-contiguous float32
// (a copy only when they are not already).
#include <optional>
#include <string>
#include <utility>

#include "arrays.hpp"

namespace favor::python {

/// A codebook array viewed as [1, Hc, c, D]; `rank` (2 or 3) gives results their shape.
struct CodebookInput {
  py::array keep;
  TensorView view;
  int rank = 3;
};

inline CodebookInput as_codebook(const py::handle& obj, const std::string& name) {
  if (obj.is_none()) throw Error(name + ": is None; expected a float array [c, D] or [H, c, D]");
  py::array a = py::array::ensure(obj);
  if (!a) throw Error(name + ": cannot be read as an array");
  if (a.ndim() != 2 && a.ndim() != 3) {
    throw Error(name + ": has rank " + std::to_string(a.ndim()) +
                "; must be 2-D [c, D] (one codebook for every head) or 3-D [H or 1, c, D]");
  }
  if (a.dtype().kind() != 'f') {
    throw Error(name + ": dtype " + py::str(a.dtype()).cast<std::string>() +
                " is not a float type");
  }
  CodebookInput in;
  in.rank = static_cast<int>(a.ndim());
  in.keep = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(a);
  const int64_t hc = in.rank == 3 ? in.keep.shape(0) : 1;
  const int64_t c = in.keep.shape(in.rank - 2), d = in.keep.shape(in.rank - 1);
  in.view = TensorView::contiguous(static_cast<const float*>(in.keep.data()), {1, hc, c, d});
  return in;
}

/// A float tensor [1, Hc, c, D] handed to numpy without a copy, in the codebook's rank.
inline py::array codebook_shaped(Tensor&& t, int rank) {
  auto* owned = new Tensor(std::move(t));
  py::capsule free_when_done(owned, [](void* p) { delete static_cast<Tensor*>(p); });
  const Shape4& s = owned->shape();
  if (rank == 2) return py::array_t<float>({s[2], s[3]}, owned->data(), free_when_done);
  return py::array_t<float>({s[1], s[2], s[3]}, owned->data(), free_when_done);
}

/// The inputs and options of the VQ attention calls, checked and converted.
struct VQCall {
  Input q, k, v;
  CodebookInput codebook;
  std::optional<Mask> mask;
  VQOptions options;

  /// The output's shape [B, H, Nq, Dv].
  Shape4 output_shape() const {
    return {q.view.shape[0], q.view.shape[1], q.view.shape[2], v.view.shape[3]};
  }
  /// The output gradient dy of a backward call, of q's rank.
  Input gradient(const py::handle& dy) const {
    Input g = as_input(dy, "dy");
    check_same_rank({&q, &g}, "q, dy");
    return g;
  }
  /// (dq, dk, dv, dcodebook or None) in the inputs' and the codebook's ranks.
  py::tuple grads_tuple(VQGrads&& grads, bool codebook_grad) const {
    py::object dc = py::none();
    if (codebook_grad) dc = codebook_shaped(std::move(grads.dcodebook), codebook.rank);
    return py::make_tuple(to_array(std::move(grads.dq), q.rank),
                          to_array(std::move(grads.dk), q.rank),
                          to_array(std::move(grads.dv), q.rank), dc);
  }
};

inline VQCall vq_inputs(const py::handle& q, const py::handle& k, const py::handle& v,
                        const py::handle& codebook, bool causal, std::optional<double> scale,
                        const py::handle& key_mask, double tau, int64_t block) {
  VQCall c{as_input(q, "q"), as_input(k, "k"),
           as_input(v, "v"), as_codebook(codebook, "codebook"),
           std::nullopt,     {}};
  check_same_rank({&c.q, &c.k, &c.v}, "q, k, v");
  c.mask = as_mask(key_mask, c.k.rank, c.k.view.shape[0], c.k.view.shape[2], "key_mask");
  c.options.causal = causal;
  c.options.scale = scale;
  c.options.key_mask = mask_view(c.mask);
  c.options.tau = tau;
  c.options.block = block;
  return c;
}

}  // namespace favor::python
