// The exact feature map (math.md s.2), all constants kept, no stabilisation.
#include "favor/features.hpp"

#include <cmath>
#include <sstream>
#include <vector>

#include "core/adapted.hpp"
#include "core/validate.hpp"
#include "cpu/feature_tile.hpp"
#include "cpu/tiles.hpp"
#include "cpu/vec_math.hpp"
#include "favor/error.hpp"

namespace favor {

std::string to_string(Kernel kernel) {
  switch (kernel) {
    case Kernel::positive:
      return "positive";
    case Kernel::trig:
      return "trig";
    case Kernel::hyperbolic:
      return "hyperbolic";
    case Kernel::favorpp:
      return "favorpp";
    case Kernel::favorsharp:
      return "favorsharp";
  }
  return "?";
}

Kernel parse_kernel(const std::string& text, const std::string& argument) {
  if (text == "positive") return Kernel::positive;
  if (text == "trig") return Kernel::trig;
  if (text == "hyperbolic") return Kernel::hyperbolic;
  if (text == "favorpp" || text == "favor++") return Kernel::favorpp;
  if (text == "favorsharp" || text == "favor#") return Kernel::favorsharp;
  throw Error(argument + ": '" + text +
              "' is not a kernel; use positive, trig, hyperbolic, favorpp or favorsharp");
}

int64_t feature_count(Kernel kernel, int64_t m) {
  return kernel == Kernel::trig || kernel == Kernel::hyperbolic ? 2 * m : m;
}

bool data_adapted(Kernel kernel) {
  return kernel == Kernel::favorpp || kernel == Kernel::favorsharp;
}

Tensor features(TensorView x, const Projection& w, const FeatureOptions& options) {
  detail::check_view(x, "x");
  detail::check_projection(w, x.shape[3], "x");
  detail::check_finite(x, "x");
  const double scale = detail::resolve_scale(options.scale, x.shape[3]);
  const int64_t m = w.m(), d = w.d(), F = feature_count(options.kernel, m);
  const int64_t heads = x.shape[0] * x.shape[1];
  const auto sqrt_scale = static_cast<float>(std::sqrt(scale));
  // FAVOR++ / FAVOR#: per-head effective projections, log biases and constants.
  detail::AdaptedProjection adapted;
  if (data_adapted(options.kernel)) {
    if (!options.fit) {
      throw Error("fit: the " + to_string(options.kernel) +
                  " kernel needs FeatureOptions::fit (fit_kernel(kernel, q, k) or "
                  "KernelFit::constant)");
    }
    detail::check_fit(*options.fit, d, heads, "fit");
    adapted = detail::adapt_projection(*options.fit, w);
  }
  // Constant factors: m^-1/2 (positive, trig) and (2m)^-1/2 (hyperbolic), as a log.
  const double log_const = options.kernel == Kernel::hyperbolic
                               ? -0.5 * std::log(2.0 * m)
                               : -0.5 * std::log(static_cast<double>(m));
  Tensor out({x.shape[0], x.shape[1], x.shape[2], F});
  std::vector<float> tile(cpu::kRowTile * d), a(cpu::kRowTile * m);
  std::vector<double> half_norm2(cpu::kRowTile);
  for (int64_t b = 0; b < x.shape[0]; ++b)
    for (int64_t h = 0; h < x.shape[1]; ++h) {
      const int64_t g = adapted.heads == 1 ? 0 : b * x.shape[1] + h;
      const float* wh = adapted.heads ? adapted.w.data() + g * m * d : w.data();
      const float* bias = adapted.heads ? adapted.bias.data() + g * m : nullptr;
      const double head_const = adapted.heads ? adapted.log_const[g] : log_const;
      for (int64_t n0 = 0; n0 < x.shape[2]; n0 += cpu::kRowTile) {
        const int64_t rows = std::min(cpu::kRowTile, x.shape[2] - n0);
        cpu::gather_rows(&x.at(b, h, n0, 0), x.strides[2], x.strides[3], rows, d, sqrt_scale,
                         tile.data(), half_norm2.data());
        cpu::project_rows(tile.data(), rows, d, wh, m, a.data(), bias);
        for (int64_t r = 0; r < rows; ++r) {
          // The positive family's exponent is a - |x|^2/2 + log_const; trig's factor is
          // exp(+|x|^2/2 + log_const): key_features with off = +-|x|^2/2 + log_const.
          const double off = cpu::key_log_weight(options.kernel, half_norm2[r]) + head_const;
          float* phi = &out.at(b, h, n0 + r, 0);
          cpu::key_features(options.kernel, a.data() + r * m, m, off, phi);
          for (int64_t f = 0; f < F; ++f) {
            if (!std::isfinite(phi[f])) {
              std::ostringstream os;
              os << "x: row [" << b << ',' << h << ',' << n0 + r
                 << "] has |x|^2 scale/2 = " << half_norm2[r]
                 << "; its features overflow float32 (use attention, which "
                 << "stabilises, or a smaller scale)";
              throw Error(os.str());
            }
          }
        }
      }
    }
  return out;
}

}  // namespace favor
