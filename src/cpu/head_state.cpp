#include "cpu/head_state.hpp"

#include <algorithm>
#include <cmath>

#include "cpu/blas.hpp"
#include "cpu/feature_tile.hpp"
#include "cpu/vec_math.hpp"

namespace favor::cpu {

void HeadState::clear() {
  std::fill(Sx, Sx + features * ld(), 0.0f);
  max = -std::numeric_limits<double>::infinity();
}

void HeadState::raise_max(double new_max) {
  if (std::isinf(max)) {  // empty state: nothing to rescale
    max = new_max;
    return;
  }
  const auto factor = static_cast<float>(std::exp(max - new_max));
  for (int64_t i = 0; i < features * ld(); ++i) Sx[i] *= factor;
  max = new_max;
}

void HeadState::accumulate(const float* phi, const float* vx, int64_t rows) {
  gemm(true, false, features, ld(), rows, 1.0f, phi, features, vx, ld(), 1.0f, Sx, ld());
}

void HeadState::add(const HeadState& other) {
  if (std::isinf(other.max)) return;  // other is empty
  if (other.max > max) raise_max(other.max);
  const auto factor = static_cast<float>(std::exp(other.max - max));
  for (int64_t i = 0; i < features * ld(); ++i) Sx[i] += factor * other.Sx[i];
}

void HeadState::copy_from(const HeadState& other) {
  std::copy(other.Sx, other.Sx + features * ld(), Sx);
  max = other.max;
}

void HeadState::copy_normaliser(float* out) const {
  for (int64_t f = 0; f < features; ++f) out[f] = Sx[f * ld() + dv];
}

void gather_values(const float* base, int64_t stride_n, int64_t stride_d, int64_t rows, int64_t dv,
                   float* vx) {
  for (int64_t r = 0; r < rows; ++r) {
    gather_rows(base + r * stride_n, stride_n, stride_d, 1, dv, 1.0f, vx + r * (dv + 1), nullptr);
    vx[r * (dv + 1) + dv] = 1.0f;
  }
}

void write_zero_rows(float* out, int64_t rows, int64_t dv, int64_t stride_n, int64_t stride_d) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t x = 0; x < dv; ++x) out[r * stride_n + x * stride_d] = 0.0f;
}

int64_t write_rows(const float* yx, int64_t rows, int64_t dv, float* out, int64_t stride_n,
                   int64_t stride_d) {
  int64_t zero_rows = 0;
  for (int64_t r = 0; r < rows; ++r) {
    float* dst = out + r * stride_n;
    const float* src = yx + r * (dv + 1);
    const float den = src[dv];
    bool ok = den > 0.0f;
    if (ok && stride_d == 1) {
      ok = scale_copy_finite(src, 1.0f / den, dst, dv);
    } else if (ok) {
      const float inv = 1.0f / den;
      for (int64_t x = 0; x < dv; ++x) {
        const float value = src[x] * inv;
        ok = ok && std::isfinite(value);
        dst[x * stride_d] = value;
      }
    }
    if (!ok) {
      ++zero_rows;
      for (int64_t x = 0; x < dv; ++x) dst[x * stride_d] = 0.0f;
    }
  }
  return zero_rows;
}

}  // namespace favor::cpu
