#include "core/rng.hpp"

#include <cmath>
#include <numbers>

namespace favor::detail {
namespace {
uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}
}  // namespace

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

Rng::Rng(uint64_t seed, uint64_t stream) {
  // Mix the stream into the seed through one splitmix step so nearby (seed, stream)
  // pairs give unrelated states.
  uint64_t mix = stream;
  uint64_t state = seed ^ splitmix64(mix);
  for (uint64_t& word : s_) word = splitmix64(state);
}

uint64_t Rng::next_u64() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform_open() {
  // (k + 0.5) / 2^53 for k in [0, 2^53): never 0 or 1, so log() below is finite.
  return (static_cast<double>(next_u64() >> 11) + 0.5) * 0x1.0p-53;
}

double Rng::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  const double u1 = uniform_open();
  const double u2 = uniform_open();
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double t = 2.0 * std::numbers::pi * u2;
  spare_ = r * std::sin(t);
  has_spare_ = true;
  return r * std::cos(t);
}

}  // namespace favor::detail
