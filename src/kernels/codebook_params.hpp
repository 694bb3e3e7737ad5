#pragma once
// The kernel contract of codebook learning (favor/codebook.hpp), free of CPU policy: the keys a
// codebook learns from, k-means as a run the facade drives, the EMA step and the
// quantisation of keys. The facade (src/codebook.cpp) validates and fills; kernels never
// throw.
#include <cstdint>
#include <optional>
#include <vector>

#include "favor/tensor.hpp"

namespace favor::kernels {

/// Keys [B, H, N, D] (masked keys left out) in groups: one per head, or one of every head
/// (pooled: a codebook shared by the heads). Order within a group: batch, head, position.
struct CodebookKeys {
  TensorView keys;
  std::optional<KeyMaskView> mask;
  bool pooled;
};

/// k-means on the groups of CodebookKeys, one codebook per group, driven by the facade
/// (it reports the error between the steps). Holds its keys: the CodebookKeys' views need
/// not outlive the call that made it.
class KMeansRun {
 public:
  virtual ~KMeansRun() = default;
  /// k-means++ seeding; group g draws from Rng(seed, g).
  virtual void seed(uint64_t seed) = 0;
  /// Assigns every key to its nearest code; the mean over groups of the mean |k - C_z|^2.
  virtual double assign() = 0;
  /// The Lloyd step (every code to the mean of its keys; empty codes re-seeded).
  virtual void update() = 0;
  /// [groups][codes][d].
  virtual const std::vector<float>& codebook() const = 0;
};

/// One EMA step (group g updates codebook g).
struct CodebookEMA {
  float* codebook;   // [groups][codes][d]
  float* ema_sum;    // [groups][codes][d]
  float* ema_count;  // [groups][codes]
  int64_t* unused;   // [groups][codes]
  int64_t codes, d;
  double decay, eps;
  int64_t dead_after;  // 0: never re-seed
  uint64_t seed;       // group g draws from Rng(seed, g)
};

/// The keys against a codebook [groups][codes][d], each key to its nearest code z.
struct CodebookQuantise {
  CodebookKeys keys;
  const float* codebook;
  int64_t codes;
};

}  // namespace favor::kernels
