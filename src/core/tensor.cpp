#include "favor/tensor.hpp"

#include <sstream>

#include "favor/error.hpp"

namespace favor {

Shape4 contiguous_strides(const Shape4& shape) {
  return {shape[1] * shape[2] * shape[3], shape[2] * shape[3], shape[3], 1};
}

Tensor::Tensor(const Shape4& shape, float fill) : shape_(shape) {
  for (int64_t s : shape) {
    if (s < 0) throw Error("Tensor: shape " + shape_string(shape) + " has a negative extent");
  }
  data_.assign(static_cast<size_t>(shape[0] * shape[1] * shape[2] * shape[3]), fill);
}

Tensor::Tensor(const Shape4& shape, std::vector<float> values)
    : shape_(shape), data_(std::move(values)) {
  const int64_t n = shape[0] * shape[1] * shape[2] * shape[3];
  if (n != static_cast<int64_t>(data_.size())) {
    throw Error("Tensor: shape " + shape_string(shape) + " needs " + std::to_string(n) +
                " values, got " + std::to_string(data_.size()));
  }
}

std::string shape_string(const Shape4& shape) {
  std::ostringstream os;
  os << '[' << shape[0] << ',' << shape[1] << ',' << shape[2] << ',' << shape[3] << ']';
  return os.str();
}

}  // namespace favor
