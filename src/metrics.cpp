#include "favor/metrics.hpp"

#include <cmath>

#include "core/validate.hpp"
#include "favor/error.hpp"
#include "favor/reference.hpp"

namespace favor {

double relative_frobenius_error(TensorView approx, TensorView exact) {
  detail::check_view(approx, "approx");
  detail::check_view(exact, "exact");
  if (approx.shape != exact.shape) {
    throw Error("approx " + shape_string(approx.shape) + ", exact " + shape_string(exact.shape) +
                ": shapes must match");
  }
  detail::check_finite(approx, "approx");
  detail::check_finite(exact, "exact");
  double diff = 0.0, norm = 0.0;
  for (int64_t b = 0; b < exact.shape[0]; ++b)
    for (int64_t h = 0; h < exact.shape[1]; ++h)
      for (int64_t n = 0; n < exact.shape[2]; ++n)
        for (int64_t x = 0; x < exact.shape[3]; ++x) {
          const double e = exact.at(b, h, n, x), a = approx.at(b, h, n, x);
          diff += (a - e) * (a - e);
          norm += e * e;
        }
  if (!(norm > 0.0)) throw Error("exact: Frobenius norm is 0; the relative error is undefined");
  return std::sqrt(diff / norm);
}

double kernel_mse(TensorView x, TensorView y, const Projection& w, const FeatureOptions& options) {
  detail::check_view(x, "x");
  detail::check_view(y, "y");
  if (x.shape[0] != 1 || x.shape[1] != 1 || y.shape[0] != 1 || y.shape[1] != 1 ||
      x.shape[3] != y.shape[3]) {
    throw Error("x " + shape_string(x.shape) + ", y " + shape_string(y.shape) +
                ": kernel_mse takes [1, 1, N, D] views with the same D");
  }
  detail::check_finite(x, "x");
  detail::check_finite(y, "y");
  const double scale = detail::resolve_scale(options.scale, x.shape[3]);
  const auto px = reference::features(x, w, options);
  const auto py = reference::features(y, w, options);
  const int64_t F = px.shape[3], D = x.shape[3];
  double sum = 0.0;
  for (int64_t i = 0; i < x.shape[2]; ++i)
    for (int64_t j = 0; j < y.shape[2]; ++j) {
      double est = 0.0, dot = 0.0;
      for (int64_t f = 0; f < F; ++f) est += px.at(0, 0, i, f) * py.at(0, 0, j, f);
      for (int64_t t = 0; t < D; ++t)
        dot += static_cast<double>(x.at(0, 0, i, t)) * y.at(0, 0, j, t);
      const double err = est - std::exp(scale * dot);
      sum += err * err;
    }
  return sum / static_cast<double>(x.shape[2] * y.shape[2]);
}

}  // namespace favor
