// The exact feature map (math.md s.2), all constants kept, no stabilisation: the facade
// resolves the map and calls the backend (kernels::FeaturesParams).
#include "favor/features.hpp"

#include <cmath>
#include <sstream>
#include <vector>

#include "core/feature_map_params.hpp"
#include "core/validate.hpp"
#include "favor/error.hpp"
#include "favor/kernel_rules.hpp"
#include "kernels/backend.hpp"

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
    case Kernel::hedgehog:
      return "hedgehog";
  }
  return "?";
}

const std::vector<std::pair<std::string, Kernel>>& kernel_names() {
  static const std::vector<std::pair<std::string, Kernel>> names{
      {"positive", Kernel::positive},     {"trig", Kernel::trig},
      {"hyperbolic", Kernel::hyperbolic}, {"favorpp", Kernel::favorpp},
      {"favorsharp", Kernel::favorsharp}, {"hedgehog", Kernel::hedgehog},
      {"favor++", Kernel::favorpp},       {"favor#", Kernel::favorsharp}};
  return names;
}

Kernel parse_kernel(const std::string& text, const std::string& argument) {
  for (const auto& [name, kernel] : kernel_names()) {
    if (text == name) return kernel;
  }
  throw Error(argument + ": '" + text +
              "' is not a kernel; use positive, trig, hyperbolic, favorpp, favorsharp or hedgehog");
}

int64_t feature_count(Kernel kernel, int64_t m) {
  return kernel == Kernel::trig || kernel == Kernel::hyperbolic || kernel == Kernel::hedgehog
             ? 2 * m
             : m;
}

double feature_log_constant(Kernel kernel, int64_t m) {
  return kernel == Kernel::hedgehog     ? 0.0
         : kernel == Kernel::hyperbolic ? -0.5 * std::log(2.0 * double(m))
                                        : -0.5 * std::log(double(m));
}

KernelForm kernel_form(Kernel kernel) {
  if (kernel == Kernel::trig) return {"trig", 0.5};
  const double norm = kernel == Kernel::hedgehog ? 0.0 : -0.5;
  return {feature_count(kernel, 1) == 2 ? "exp_pm" : "exp", norm};
}

bool data_adapted(Kernel kernel) {
  return kernel == Kernel::favorpp || kernel == Kernel::favorsharp;
}

void check_fit_kernel(Kernel kernel, bool constant, const std::string& fit_argument,
                      const std::string& kernel_argument, const std::string& calibration) {
  if (!data_adapted(kernel)) {
    throw Error(fit_argument + ": only the favorpp and favorsharp kernels take a fit (" +
                kernel_argument + " is " + to_string(kernel) + ")");
  }
  if (constant && kernel != Kernel::favorpp) {
    throw Error(fit_argument + ": one A for every direction is FAVOR++; favorsharp needs " +
                calibration);
  }
}

Tensor features(TensorView x, const Projection& w, const FeatureOptions& options) {
  FeatureMap map(w, options.kernel);
  map.scale = options.scale;
  map.fit = options.fit;
  return features(x, map);
}

Tensor features(TensorView x, const FeatureMap& map) {
  detail::check_view(x, "x");
  detail::check_projection(map.projection, x.shape[3], "x");
  detail::check_finite(x, "x");
  if (data_adapted(map.kernel) && !map.fit) {
    throw Error("fit: the " + to_string(map.kernel) +
                " kernel needs a fit (fit_kernel(kernel, q, k) or KernelFit::constant)");
  }
  const detail::ResolvedMap resolved = detail::resolve_fixed_map(map, x.shape[0], x.shape[1], {});
  // The unweighted map: lambda multiplies the rows below (key_features would apply lambda^2).
  kernels::FeatureParams fp = resolved.params();
  fp.key_logw = nullptr;
  const int64_t m = fp.m;
  const auto& adapted = resolved.adapted;
  const double log_const = feature_log_constant(map.kernel, m);
  Tensor out({x.shape[0], x.shape[1], x.shape[2], fp.features()});
  kernels::FeaturesParams p{};
  p.x = x.data;
  p.x_strides = x.strides;
  p.batch = x.shape[0];
  p.heads = x.shape[1];
  p.n = x.shape[2];
  p.map = fp;
  p.log_const = log_const;
  p.head_log_const = adapted.heads ? adapted.log_const.data() : nullptr;
  p.log_const_sets = adapted.heads;
  p.lambda = map.lambda.empty() ? nullptr : map.lambda.data();
  p.lambda_sets = map.heads;
  p.out = out.data();
  const kernels::FeatureOverflow bad = kernels::backend().features(p);
  if (bad.found) {
    std::ostringstream os;
    os << "x: row [" << bad.b << ',' << bad.h << ',' << bad.n
       << "] has |x|^2 scale/2 = " << bad.half_norm2
       << "; its features overflow float32 (use attention, which "
       << "stabilises, or a smaller scale)";
    throw Error(os.str());
  }
  return out;
}

}  // namespace favor
