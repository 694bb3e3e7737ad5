#pragma once
/// \file features.hpp
/// Random feature maps phi(x) with E[phi(x).phi(y)] = exp(scale * x.y). See docs/math.md.
#include <optional>
#include <string>

#include "favor/projection.hpp"
#include "favor/tensor.hpp"

namespace favor {

/// The feature map. F (features per row) is m for positive and 2m for trig and hyperbolic.
enum class Kernel {
  positive,    ///< FAVOR+: m^-1/2 exp(W x - |x|^2/2)
  trig,        ///< RFF: m^-1/2 exp(|x|^2/2) [sin(W x), cos(W x)]
  hyperbolic,  ///< (2m)^-1/2 exp(-|x|^2/2) [exp(W x), exp(-W x)]
};

std::string to_string(Kernel kernel);
/// Parses "positive" / "trig" / "hyperbolic"; throws favor::Error naming `argument`.
Kernel parse_kernel(const std::string& text, const std::string& argument);
/// Features per row for a kernel with m projections.
int64_t feature_count(Kernel kernel, int64_t m);

struct FeatureOptions {
  Kernel kernel = Kernel::positive;
  /// Softmax temperature: the kernel is exp(scale * q.k). Default 1/sqrt(D); 1 gives the
  /// raw exp(q.k). Inputs are multiplied by sqrt(scale) before the map.
  std::optional<double> scale;
};

/// The exact feature map phi(x) as math.md s.2 defines it (all constants kept, no
/// stabilisation), so that phi(q).phi(k) is an unbiased estimate of exp(scale q.k).
/// x: [B, H, N, D] with D == w.d(). Returns [B, H, N, F]. Throws favor::Error on bad
/// shapes, non-finite input, or if a feature overflows float32 (use attention instead,
/// which stabilises).
Tensor features(TensorView x, const Projection& w, const FeatureOptions& options = {});

}  // namespace favor
