#include "workload.hpp"

#include <cmath>

namespace favor::cli {

Tensor gaussian_rows(const Shape4& shape, uint64_t seed, double norm) {
  const int64_t rows = shape[0] * shape[1] * shape[2], d = shape[3];
  const Projection p = Projection::draw(rows, d, {ProjectionKind::iid, NormMode::chi, seed});
  Tensor t(shape, p.matrix());
  for (int64_t r = 0; norm > 0.0 && r < rows; ++r) {
    float* row = t.data() + r * d;
    double n2 = 0.0;
    for (int64_t x = 0; x < d; ++x) n2 += double(row[x]) * row[x];
    for (int64_t x = 0; x < d; ++x) row[x] = static_cast<float>(row[x] * norm / std::sqrt(n2));
  }
  return t;
}

}  // namespace favor::cli
