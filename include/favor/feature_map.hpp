#pragma once
/// \file feature_map.hpp
/// One descriptor for a feature map: the kernel, the projection, the temperature, the
/// FAVOR++ / FAVOR# fit and the learned per-head parameters (projections, biases, feature
/// weights). Attention, its backward pass, the decoder, features() and the reference all take
/// it, so a new map is added in one place. See docs/estimators.md and math.md s.2 and s.7.
#include <cstdint>
#include <optional>
#include <vector>

#include "favor/estimators.hpp"
#include "favor/features.hpp"
#include "favor/projection.hpp"

namespace favor {

/// phi(x) for head h, with x' = sqrt(scale) x, a = W_h x' + b_h (W_h = weights[h] when set,
/// else the projection's W; b_h = bias[h] when set, else 0) and lambda_h = lambda[h] (else 1):
///   positive    lambda_f m^-1/2 exp(a_f - |x'|^2/2)
///   trig        lambda_f m^-1/2 exp(|x'|^2/2) [sin a_f, cos a_f]
///   hyperbolic  lambda_f (2m)^-1/2 exp(-|x'|^2/2) [exp(a_f), exp(-a_f)]
///   hedgehog    lambda_f [exp(a_f), exp(-a_f)]           (a learned map: no norm factor)
///   favorpp / favorsharp: the fitted positive maps of estimators.hpp (no weights, bias or
///               lambda of their own: the fit sets them).
/// lambda has one weight per projection row f (the WPFF weights of seed 003, Theorem 3), which
/// multiplies every feature that row makes; only lambda_f^2 enters attention, so its sign does
/// not matter. The kernel phi(q).phi(k) is exp(scale q.k) in expectation for the random maps
/// with no learned parameters; learned maps are judged by their attention error instead.
struct FeatureMap {
  Kernel kernel = Kernel::positive;
  Projection projection;         ///< W (m x d): every head's, unless `weights` is set
  std::optional<double> scale;   ///< default 1/sqrt(D)
  std::optional<KernelFit> fit;  ///< FAVOR++ / FAVOR# (as AttentionOptions::fit)
  /// Sets of per-head parameters in weights / bias / lambda: 1 (shared by every head), H (one
  /// per head, shared over the batch) or B*H (one per (batch, head), entry b*H + h).
  int64_t heads = 1;
  std::vector<float> weights;  ///< [heads][m][d] learned projections, or empty (projection)
  std::vector<float> bias;     ///< [heads][m], or empty (0)
  std::vector<float> lambda;   ///< [heads][m] feature weights, nonzero, or empty (1)

  explicit FeatureMap(Projection w, Kernel kernel = Kernel::positive) noexcept
      : kernel(kernel), projection(std::move(w)) {}

  int64_t m() const { return projection.m(); }
  int64_t d() const { return projection.d(); }
  int64_t features() const { return feature_count(kernel, projection.m()); }
  /// True when the map has learned parameters (weights, bias or lambda).
  bool learned() const { return !weights.empty() || !bias.empty() || !lambda.empty(); }
  /// Gives every head its own copy of the parameters that are set or asked for: weights
  /// (from the projection), bias (zeros) and lambda (ones), `heads` sets each. The usual
  /// starting point for training.
  FeatureMap& learnable(int64_t heads, bool weights = true, bool bias = true, bool lambda = true);
};

/// Checks a map against the head dim `d` and `batch_heads` = B*H, `head_count` = H of a call
/// (heads in {1, H, B*H}, sizes, finite values, lambda nonzero, no learned parameters on
/// FAVOR++ / FAVOR#); throws favor::Error naming `argument` and the rule.
void check_feature_map(const FeatureMap& map, int64_t d, int64_t head_count, int64_t batch_heads,
                       const char* argument = "map");

/// features() with a FeatureMap: [B, H, N, F], all constants kept (see features.hpp).
Tensor features(TensorView x, const FeatureMap& map);

}  // namespace favor
