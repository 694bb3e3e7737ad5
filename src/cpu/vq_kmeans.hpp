#pragma once
// k-means on the key groups of codebook learning: k-means++ seeding (D^2 sampling) and Lloyd
// iterations, one codebook per group. The facade (src/codebook.cpp) drives the iterations
// and reports the error between them; nothing here throws.
#include <cstdint>
#include <vector>

#include "cpu/vq_key_groups.hpp"

namespace favor::cpu {

class KMeans {
 public:
  /// codes <= keys.size(g) for every group (the facade checks). Allocates every buffer.
  KMeans(const KeyGroups& keys, int64_t codes, int threads);

  /// k-means++: the first code is a uniform key, each further code a key drawn with
  /// probability proportional to its squared distance to the nearest code so far. Group g
  /// draws from Rng(seed, g), so codes depend on (keys, codes, seed) only.
  void seed(uint64_t seed);
  /// Starts from given codes instead ([groups][codes][d]): a warm start.
  void start_from(const float* codebook);
  /// Assigns every key to its nearest code; returns the mean over groups of the mean
  /// squared distance |k - C_z|^2 (the error of the current codes).
  double assign();
  /// The Lloyd step: every code moves to the mean of its keys (accumulated in double).
  /// A code without keys takes the key farthest from its code among clusters of >= 2 keys,
  /// which leaves that cluster and becomes the code's only key: the error cannot grow
  /// (the moved key costs 0, and the cluster it left is nearer its new mean than its old).
  void update();

  /// [groups][codes][d].
  const std::vector<float>& codebook() const { return codebook_; }

 private:
  void seed_group(int64_t g, uint64_t seed, float* dist2, float* work);
  void update_group(int64_t g, double* sums, int64_t* counts, std::vector<int64_t>& order);

  const KeyGroups& keys_;
  int64_t codes_;
  int threads_;
  std::vector<float> codebook_;
  std::vector<int32_t> z_, last_z_;  // assignment, and the one the codes are the means of
  std::vector<float> dist2_;
  std::vector<double> error_;     // per group
  std::vector<uint8_t> active_;   // 0 once a group's assignment is stable: its codes are final
  std::vector<uint8_t> updated_;  // the group's codes are the means of last_z_
};

}  // namespace favor::cpu
