#include "core/fingerprint.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "core/helper_threads.hpp"
#include "core/validate.hpp"
#include "favor/runtime.hpp"

namespace favor::detail {
namespace {

// Four independent multiply-xor lanes over 64-bit words: about memory speed (the lanes
// hide the multiply latency), against ~1 ns per byte for a byte-wise FNV chain.
class Hasher {
 public:
  void words(const unsigned char* p, size_t n_bytes) {
    // The lanes in locals: p may alias the members (a char pointer), so the compiler would
    // otherwise store and reload them on every word (3x slower); the same values.
    uint64_t lane[4] = {lane_[0], lane_[1], lane_[2], lane_[3]};
    size_t i = 0;
    for (; i + 32 <= n_bytes; i += 32) {
      for (int l = 0; l < 4; ++l) {
        uint64_t w;
        std::memcpy(&w, p + i + 8 * l, 8);
        lane[l] = (lane[l] ^ w) * kPrime;
      }
    }
    for (; i < n_bytes; ++i) lane[0] = (lane[0] ^ p[i]) * kPrime;
    for (int l = 0; l < 4; ++l) lane_[l] = lane[l];
  }
  template <class T>
  void value(T x) {
    words(reinterpret_cast<const unsigned char*>(&x), sizeof x);
  }
  // Each (batch, head) slice is hashed on its own, in parallel (favor's threads), and the
  // slices' digests are taken in order: the same value on any number of threads. With a
  // name, each row is also scanned for NaN and Inf while it is in cache, and a bad value
  // throws check_finite's error (which names the first).
  void tensor(const TensorView& t, const char* finite_name = nullptr) {
    for (int64_t s : t.shape) value(s);
    const int64_t slices = t.shape[0] * t.shape[1];
    std::vector<uint64_t> digests(static_cast<size_t>(slices));
    const int team = slices > 1 ? helper_team() : 1;
    bool bad = false;
#pragma omp parallel for num_threads(team) schedule(static) reduction(|| : bad) if (team > 1)
    for (int64_t bh = 0; bh < slices; ++bh) {
      const int64_t b = bh / t.shape[1], h = bh % t.shape[1];
      Hasher f;
      const int64_t d = t.shape[3];
      if (t.strides[3] == 1 && t.strides[2] == d && d * sizeof(float) % 32 == 0) {
        // contiguous rows of whole 32-byte words: hashed in blocks of rows (the same value
        // as row by row), each scanned while it is in L1
        const float* slice = &t.at(b, h, 0, 0);
        const int64_t total = t.shape[2] * d, block = std::max<int64_t>(d, 4096 / d * d);
        for (int64_t at = 0; at < total; at += block) {
          const int64_t len = std::min(block, total - at);
          if (finite_name) bad = bad || any_nonfinite(slice + at, len);
          f.words(reinterpret_cast<const unsigned char*>(slice + at),
                  static_cast<size_t>(len) * sizeof(float));
        }
        digests[static_cast<size_t>(bh)] = f.digest();
        continue;
      }
      std::vector<float> row(static_cast<size_t>(d));
      for (int64_t n = 0; n < t.shape[2]; ++n) {
        const float* src = &t.at(b, h, n, 0);
        if (t.strides[3] != 1) {  // strided rows: gather so that the hash is of the values
          for (int64_t x = 0; x < t.shape[3]; ++x) row[x] = src[x * t.strides[3]];
          src = row.data();
        }
        if (finite_name) bad = bad || any_nonfinite(src, t.shape[3]);
        f.words(reinterpret_cast<const unsigned char*>(src),
                static_cast<size_t>(t.shape[3]) * sizeof(float));
      }
      digests[static_cast<size_t>(bh)] = f.digest();
    }
    team_ran(team);
    if (bad) check_finite(t, finite_name);
    for (uint64_t d : digests) value(d);
  }
  uint64_t digest() const {
    uint64_t h = 1469598103934665603ull;
    for (uint64_t l : lane_) h = (h ^ l) * kPrime;
    return h ^ (h >> 29);
  }

 private:
  static constexpr uint64_t kPrime = 1099511628211ull;
  uint64_t lane_[4] = {0x9E3779B97F4A7C15ull, 0xBF58476D1CE4E5B9ull, 0x94D049BB133111EBull,
                       1469598103934665603ull};
};

void hash_mask(Hasher& f, const std::optional<KeyMaskView>& mask) {
  if (!mask) return;
  for (int64_t b = 0; b < mask->batch; ++b)
    for (int64_t j = 0; j < mask->n; ++j) f.value(mask->at(b, j));
}

}  // namespace

uint64_t context_fingerprint(const TensorView& q, const TensorView& k, const TensorView& v,
                             const AttentionOptions& options) {
  Hasher f;
  if (options.causal || options.window > 0 || options.sinks > 0) f.tensor(q);  // or hybrid
  f.tensor(k);
  f.tensor(v);
  f.value(options.causal);
  f.value(options.window);
  f.value(options.sinks);
  hash_mask(f, options.key_mask);
  return f.digest();
}

struct ExactInputsFingerprint::State {
  Hasher f;
};

ExactInputsFingerprint::ExactInputsFingerprint(const TensorView& q, const TensorView& k,
                                               const TensorView& v, bool check_finite)
    : state_(std::make_unique<State>()) {
  state_->f.tensor(q, check_finite ? "q" : nullptr);
  state_->f.tensor(k, check_finite ? "k" : nullptr);
  state_->f.tensor(v, check_finite ? "v" : nullptr);
}

ExactInputsFingerprint::~ExactInputsFingerprint() = default;

uint64_t ExactInputsFingerprint::finish(const TensorView& y, const ExactOptions& options,
                                        double scale) const {
  Hasher f = state_->f;
  f.tensor(y);
  f.value(options.causal);
  f.value(scale);
  f.value(options.window);
  f.value(options.sinks);
  hash_mask(f, options.key_mask);
  return f.digest();
}

uint64_t exact_context_fingerprint(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const TensorView& y, const ExactOptions& options, double scale) {
  return ExactInputsFingerprint(q, k, v, false).finish(y, options, scale);
}

}  // namespace favor::detail
