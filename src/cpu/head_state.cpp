#include "cpu/head_state.hpp"

#include <algorithm>
#include <cmath>

#include "cpu/blas.hpp"

namespace favor::cpu {

void HeadState::clear() {
  for (int64_t i = 0; i < features * dv; ++i) S[i] = 0.0f;
  for (int64_t i = 0; i < features; ++i) s[i] = 0.0f;
  max = -std::numeric_limits<double>::infinity();
}

void HeadState::raise_max(double new_max) {
  if (std::isinf(max)) {  // empty state: nothing to rescale
    max = new_max;
    return;
  }
  const auto factor = static_cast<float>(std::exp(max - new_max));
  for (int64_t i = 0; i < features * dv; ++i) S[i] *= factor;
  for (int64_t i = 0; i < features; ++i) s[i] *= factor;
  max = new_max;
}

void HeadState::accumulate(const float* phi, const float* v, int64_t rows, const float* ones) {
  gemm(true, false, features, dv, rows, 1.0f, phi, features, v, dv, 1.0f, S, dv);
  gemv(true, rows, features, 1.0f, phi, features, ones, 1.0f, s);
}

void HeadState::add(const HeadState& other) {
  if (std::isinf(other.max)) return;  // other is empty
  if (other.max > max) raise_max(other.max);
  const auto factor = static_cast<float>(std::exp(other.max - max));
  for (int64_t i = 0; i < features * dv; ++i) S[i] += factor * other.S[i];
  for (int64_t i = 0; i < features; ++i) s[i] += factor * other.s[i];
}

void HeadState::copy_from(const HeadState& other) {
  std::copy(other.S, other.S + features * dv, S);
  std::copy(other.s, other.s + features, s);
  max = other.max;
}

int64_t write_rows(const float* y, const float* den, int64_t rows, int64_t dv, float* out,
                   int64_t stride_n, int64_t stride_d) {
  int64_t zero_rows = 0;
  for (int64_t r = 0; r < rows; ++r) {
    float* dst = out + r * stride_n;
    const float* src = y + r * dv;
    bool ok = den[r] > 0.0f;
    if (ok) {
      const float inv = 1.0f / den[r];
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
