#pragma once
/// \file features.hpp
/// Random feature maps phi(x) with E[phi(x).phi(y)] = exp(scale * x.y). See docs/math.md.
#include <optional>
#include <string>

#include "favor/estimators.hpp"
#include "favor/projection.hpp"
#include "favor/tensor.hpp"

namespace favor {

/// The feature map. F (features per row) is 2m for trig, hyperbolic and hedgehog, m for the
/// others.
enum class Kernel {
  positive,    ///< FAVOR+: m^-1/2 exp(W x - |x|^2/2)
  trig,        ///< RFF: m^-1/2 exp(|x|^2/2) [sin(W x), cos(W x)]
  hyperbolic,  ///< (2m)^-1/2 exp(-|x|^2/2) [exp(W x), exp(-W x)]
  favorpp,     ///< FAVOR++ (OPRF), positive features with the optimal A (estimators.hpp)
  favorsharp,  ///< FAVOR# (SDERF), positive features with per-direction A_l (estimators.hpp)
  hedgehog,    ///< learned map [exp(W x + b), exp(-W x - b)] (Hedgehog; feature_map.hpp, fit.hpp)
};

std::string to_string(Kernel kernel);
/// Parses "positive" / "trig" / "hyperbolic" / "favorpp" / "favorsharp" / "hedgehog" (also
/// "favor++", "favor#"); throws favor::Error naming `argument`.
Kernel parse_kernel(const std::string& text, const std::string& argument);
/// Features per row for a kernel with m projections.
int64_t feature_count(Kernel kernel, int64_t m);
/// The log of each feature's constant factor for m projections: -log(m) / 2 (positive,
/// trig, and FAVOR++ / FAVOR# before their fit's factor), -log(2m) / 2 (hyperbolic), 0
/// (hedgehog, a learned map), so that phi(q).phi(k) estimates exp(scale q.k).
double feature_log_constant(Kernel kernel, int64_t m);

/// The canonical form of a kernel's features (docs/math.md; every kernel, CPU and device
/// ones, computes in it): with a = W x + b on the scaled input and g = key_norm |x|^2,
/// `exp`: phi_f = exp(a_f + g) (F = m); `exp_pm`: exp(+-a_f + g) (F = 2m); `trig`:
/// [sin a, cos a] exp(g) (F = 2m). key_norm is -1/2, +1/2 (trig) or 0 (hedgehog).
struct KernelForm {
  std::string form;
  double key_norm;
};
KernelForm kernel_form(Kernel kernel);

struct FeatureOptions {
  Kernel kernel = Kernel::positive;
  /// Softmax temperature: the kernel is exp(scale * q.k). Default 1/sqrt(D); 1 gives the
  /// raw exp(q.k). Inputs are multiplied by sqrt(scale) before the map.
  std::optional<double> scale;
  /// FAVOR++ / FAVOR# parameters (fit_kernel or KernelFit::constant); required by
  /// features() for those kernels, ignored by the others.
  std::optional<KernelFit> fit;
};
/// True for the kernels whose parameters come from a KernelFit.
bool data_adapted(Kernel kernel);

/// The exact feature map phi(x) as math.md s.2 defines it (all constants kept, no
/// stabilisation), so that phi(q).phi(k) is an unbiased estimate of exp(scale q.k).
/// x: [B, H, N, D] with D == w.d(). Returns [B, H, N, F]. Throws favor::Error on bad
/// shapes, non-finite input, or if a feature overflows float32 (use attention instead,
/// which stabilises).
Tensor features(TensorView x, const Projection& w, const FeatureOptions& options = {});

}  // namespace favor
