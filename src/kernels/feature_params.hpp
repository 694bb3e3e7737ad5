#pragma once
// The feature map as the kernels see it, part of the kernel contract (src/kernels/): one plain
// struct of pointers and counts, filled by the facades from a validated favor::FeatureMap
// (core/feature_map_params.hpp). Every kernel (bidirectional, causal, backward, decoder) reads the
// map only through it.
//
// Per-head parameters come in sets of 1, H or B*H; head bh = b * H + h uses set bh % sets
// (bh % H = h, bh % (B*H) = bh, bh % 1 = 0).
#include <cstdint>

#include "favor/features.hpp"
#include "favor/tensor.hpp"

namespace favor::kernels {

/// The per-key log weight that does not depend on the projection: -|y|^2/2 (positive family),
/// +|y|^2/2 (trig) or none (hedgehog, a learned map).
enum class KeyNorm { minus_half, plus_half, none };

struct FeatureParams {
  Kernel kernel = Kernel::positive;
  int64_t m = 0, d = 0;
  float sqrt_scale = 1.0f;  // inputs are multiplied by sqrt(scale) before the map
  KeyNorm key_norm = KeyNorm::minus_half;
  const float* w = nullptr;  // [w_sets][m][d], row-major
  int64_t w_sets = 1;
  const float* bias = nullptr;  // [bias_sets][m]: added to W x (FAVOR++ / FAVOR# log bias, b)
  int64_t bias_sets = 1;
  // Feature weights lambda, applied to the keys only as lambda^2 (queries unweighted: only
  // lambda_f^2 enters phi(q).phi(k)): key_logw = log lambda^2, added in the key features'
  // exponent. [lambda_sets][m]; null when the map has no weights.
  const float* key_logw = nullptr;
  int64_t lambda_sets = 1;
  // Causal decay: rate = -log gamma >= 0 per head; key j's log weight gets + j * rate (the
  // query's gamma^i cancels in the ratio). Null: no decay.
  const double* decay_rate = nullptr;
  int64_t decay_sets = 1;

  int64_t features() const { return feature_count(kernel, m); }
  const float* head_w(int64_t bh) const { return w + (bh % w_sets) * m * d; }
  const float* head_bias(int64_t bh) const { return bias ? bias + (bh % bias_sets) * m : nullptr; }
  const float* head_key_logw(int64_t bh) const {
    return key_logw ? key_logw + (bh % lambda_sets) * m : nullptr;
  }
  double head_decay(int64_t bh) const { return decay_rate ? decay_rate[bh % decay_sets] : 0.0; }
  /// Log weight of key `position` of head bh with half squared norm half_norm2 (scaled input).
  double key_log_weight(double half_norm2, int64_t bh, int64_t position) const {
    double g = key_norm == KeyNorm::minus_half  ? -half_norm2
               : key_norm == KeyNorm::plus_half ? half_norm2
                                                : 0.0;
    if (decay_rate) g += static_cast<double>(position) * head_decay(bh);
    return g;
  }
};

/// favor::features: the exact features phi(x) of every row, all constants kept, no
/// stabilisation. The map without key weights (key_logw null): lambda multiplies the rows.
struct FeaturesParams {
  const float* x;  // [B, H, N, d]
  Shape4 x_strides;
  int64_t batch, heads, n;
  FeatureParams map;
  double log_const;              // the kernel's constant factor, as a log ...
  const double* head_log_const;  // ... or per head (FAVOR++ / FAVOR#, 1 or B*H sets)
  int64_t log_const_sets;
  const float* lambda;  // [lambda_sets][m] feature weights; null: none
  int64_t lambda_sets;
  float* out;  // [B, H, N, F], C-contiguous
};

/// The first row (in b, h, n order) whose features overflow float; the features kernel
/// stops there. found = false: every feature is finite.
struct FeatureOverflow {
  bool found = false;
  int64_t b = 0, h = 0, n = 0;
  double half_norm2 = 0.0;  // |x|^2 scale / 2 of that row
};

}  // namespace favor::kernels
