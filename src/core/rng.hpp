#pragma once
// The deterministic random stream behind every projection: xoshiro256** seeded through
// splitmix64, and Box-Muller normals. Unlike std::normal_distribution its output is
// defined here, bit for bit, so projections are the same on every compiler.
#include <cstdint>

namespace favor::detail {

class Rng {
 public:
  /// Independent streams of one seed (e.g. one per orthogonal block).
  Rng(uint64_t seed, uint64_t stream);
  uint64_t next_u64();
  /// Uniform in the open interval (0, 1), 53 random bits.
  double uniform_open();
  /// Standard normal (Box-Muller; both values of a pair are used in turn).
  double normal();

 private:
  uint64_t s_[4];
  double spare_ = 0.0;
  bool has_spare_ = false;
};

/// splitmix64 finaliser, exposed for tests.
uint64_t splitmix64(uint64_t& state);

}  // namespace favor::detail
