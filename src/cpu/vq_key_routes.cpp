#include "cpu/vq_key_routes.hpp"

#include <algorithm>

#include "cpu/blas.hpp"

namespace favor::cpu {
namespace {

// Direct keys per accumulate() step: M = 128 rows x 256 keys x 4 B = 128 KiB, within L2.
constexpr int64_t kKeyChunk = 256;

// The most keys a code may have on the direct route; -1 (every code on the moments) with
// all_moments.
int64_t direct_limit(int64_t d, int64_t dv, bool all_moments) {
  return all_moments ? -1 : (d * dv - 1) / (d + dv);
}

int64_t direct_capacity(int64_t c, int64_t kmax, int64_t nk) {
  return std::max<int64_t>(0, std::min(c * kmax, nk));
}

}  // namespace

KeyRoutes::KeyRoutes(int64_t c, int64_t d, int64_t dv, int64_t tile, int64_t nk, bool all_moments)
    : c_(c),
      d_(d),
      dv_(dv),
      kmax_(direct_limit(d, dv, all_moments)),
      count_(c),
      key_(direct_capacity(c, kmax_, nk)),
      code_(key_.size()),
      slot_(c),
      zt_(tile),
      v_(key_.size() * dv),
      dk_(key_.size() * d),
      m_(tile * std::min<int64_t>(kKeyChunk, key_.size())),
      pt_(tile * c) {}

void KeyRoutes::reset() {
  std::fill(count_.begin(), count_.end(), 0);
  keys_ = 0;
}

void KeyRoutes::add_keys(const int32_t* z, const float* v, int64_t start, int64_t rows) {
  for (int64_t j = 0; j < rows; ++j) {
    if (z[j] < 0) continue;
    // A code past kmax keys goes to the moments: its first kmax keys stay listed (at most
    // c kmax entries) and are dropped in finish().
    if (++count_[z[j]] > kmax_) continue;
    key_[keys_] = start + j;
    code_[keys_] = z[j];
    std::copy(v + j * dv_, v + (j + 1) * dv_, v_.begin() + keys_ * dv_);
    ++keys_;
  }
}

void KeyRoutes::finish() {
  int64_t kept = 0;
  for (int64_t e = 0; e < keys_; ++e) {
    if (count_[code_[e]] > kmax_) continue;
    key_[kept] = key_[e];
    code_[kept] = code_[e];
    std::copy(v_.begin() + e * dv_, v_.begin() + (e + 1) * dv_, v_.begin() + kept * dv_);
    ++kept;
  }
  keys_ = kept;
  moment_codes_ = 0;
  for (int64_t s = 0; s < c_; ++s)  // codes without keys need no route (but with all_moments)
    slot_[s] = count_[s] > kmax_ ? static_cast<int32_t>(moment_codes_++) : -1;
  std::fill(dk_.begin(), dk_.begin() + keys_ * d_, 0.0f);
}

const float* KeyRoutes::moment_columns(const float* P, int64_t rows) {
  const int64_t ct = moment_codes_;
  for (int64_t s = 0; s < c_; ++s) {
    if (slot_[s] < 0) continue;
    for (int64_t i = 0; i < rows; ++i) pt_[i * ct + slot_[s]] = P[i * c_ + s];
  }
  return pt_.data();
}

const int32_t* KeyRoutes::moment_codes_of(const int32_t* z, int64_t rows) {
  for (int64_t j = 0; j < rows; ++j) zt_[j] = z[j] < 0 ? -1 : slot_[z[j]];
  return zt_.data();
}

int64_t KeyRoutes::direct_before(int64_t end) const {
  return std::lower_bound(key_.begin(), key_.begin() + keys_, end) - key_.begin();
}

void KeyRoutes::accumulate(const float* P, const float* q, const float* dy, const float* delta,
                           int64_t rows, int64_t keys, float scale) {
  // Chunks of keys, so that M (rows x chunk) stays in cache between its three passes.
  for (int64_t j0 = 0; j0 < keys; j0 += kKeyChunk) {
    const int64_t n = std::min(kKeyChunk, keys - j0);
    const int32_t* code = code_.data() + j0;
    float* M = m_.data();
    gemm(false, true, rows, n, dv_, 1.0f, dy, dv_, v_.data() + j0 * dv_, dv_, 0.0f, M, n);
    for (int64_t i = 0; i < rows; ++i) {
      const float* Pi = P + i * c_;
      float* Mi = M + i * n;
      for (int64_t j = 0; j < n; ++j) Mi[j] = Pi[code[j]] * (Mi[j] - delta[i]);
    }
    gemm(true, false, n, d_, rows, scale, M, n, q, d_, 1.0f, dk_.data() + j0 * d_, d_);
  }
}

void KeyRoutes::scatter(float* dk) const {
  for (int64_t e = 0; e < keys_; ++e)
    for (int64_t t = 0; t < d_; ++t) dk[key_[e] * d_ + t] += dk_[e * d_ + t];
}

}  // namespace favor::cpu
