#pragma once
/// \file tensor.hpp
/// Non-owning float32 views [B, H, N, D] with element strides, and a small owning tensor.
///
/// These are host views: the C++ library is CPU-only and computes on host memory, on the
/// CPU. A view has no device and no dtype: its data is float32 in host memory, read in
/// place (the functions scan input values on the host, e.g. for finiteness, before they
/// compute). Tensors on other devices (CUDA, ...) are served by the Python package's torch
/// ops (python/favor/ops/, docs/gpu.md), not by this library.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace favor {

using Shape4 = std::array<int64_t, 4>;

/// Row-major (C-order) element strides for a shape.
Shape4 contiguous_strides(const Shape4& shape);

/// Read-only view of a float32 tensor [B, H, N, D] in host memory. Strides are in elements,
/// may be any non-negative values (broadcast with stride 0 is allowed for inputs), and the
/// view never owns its memory.
struct TensorView {
  const float* data = nullptr;
  Shape4 shape{0, 0, 0, 0};
  Shape4 strides{0, 0, 0, 0};

  /// A C-contiguous view.
  static TensorView contiguous(const float* data, const Shape4& shape) {
    return TensorView{data, shape, contiguous_strides(shape)};
  }
  int64_t numel() const { return shape[0] * shape[1] * shape[2] * shape[3]; }
  const float& at(int64_t b, int64_t h, int64_t n, int64_t d) const {
    return data[b * strides[0] + h * strides[1] + n * strides[2] + d * strides[3]];
  }
};

/// Writable view of a float32 tensor [B, H, N, D] in host memory; outputs are written, never
/// read.
struct MutableTensorView {
  float* data = nullptr;
  Shape4 shape{0, 0, 0, 0};
  Shape4 strides{0, 0, 0, 0};

  static MutableTensorView contiguous(float* data, const Shape4& shape) {
    return MutableTensorView{data, shape, contiguous_strides(shape)};
  }
  int64_t numel() const { return shape[0] * shape[1] * shape[2] * shape[3]; }
  float& at(int64_t b, int64_t h, int64_t n, int64_t d) const {
    return data[b * strides[0] + h * strides[1] + n * strides[2] + d * strides[3]];
  }
  operator TensorView() const { return TensorView{data, shape, strides}; }
};

/// A C-contiguous float32 tensor [B, H, N, D] that owns its data.
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(const Shape4& shape, float fill = 0.0f);
  Tensor(const Shape4& shape, std::vector<float> values);

  const Shape4& shape() const { return shape_; }
  int64_t numel() const { return static_cast<int64_t>(data_.size()); }
  float* data() { return data_.data(); }
  const float* data() const { return data_.data(); }
  std::vector<float>& values() { return data_; }
  const std::vector<float>& values() const { return data_; }
  TensorView view() const { return TensorView::contiguous(data_.data(), shape_); }
  MutableTensorView mutable_view() { return MutableTensorView::contiguous(data_.data(), shape_); }
  operator TensorView() const { return view(); }
  float& at(int64_t b, int64_t h, int64_t n, int64_t d) { return mutable_view().at(b, h, n, d); }
  float at(int64_t b, int64_t h, int64_t n, int64_t d) const { return view().at(b, h, n, d); }

 private:
  Shape4 shape_{0, 0, 0, 0};
  std::vector<float> data_;
};

/// "[2,4,128,64]": for messages.
std::string shape_string(const Shape4& shape);

/// Key padding mask [B, Nk]: nonzero means the key takes part. Strides in elements.
struct KeyMaskView {
  const uint8_t* data = nullptr;
  int64_t batch = 0;
  int64_t n = 0;
  int64_t stride_b = 0;
  int64_t stride_n = 1;

  static KeyMaskView contiguous(const uint8_t* data, int64_t batch, int64_t n) {
    return KeyMaskView{data, batch, n, n, 1};
  }
  bool at(int64_t b, int64_t j) const { return data[b * stride_b + j * stride_n] != 0; }
};

}  // namespace favor
