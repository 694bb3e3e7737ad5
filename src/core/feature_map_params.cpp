#include "core/feature_map_params.hpp"

#include <cmath>
#include <cstring>
#include <string>

#include "favor/error.hpp"

namespace favor::detail {
namespace {

uint64_t mix(uint64_t h, const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

template <class T>
uint64_t mix(uint64_t h, const std::vector<T>& values) {
  h = mix(h, values.data(), values.size() * sizeof(T));
  const uint64_t n = values.size();
  return mix(h, &n, sizeof n);
}

kernels::KeyNorm key_norm(Kernel kernel) {  // kernel_form's key_norm (features.cpp)
  const double c = kernel_form(kernel).key_norm;
  return c > 0   ? kernels::KeyNorm::plus_half
         : c < 0 ? kernels::KeyNorm::minus_half
                 : kernels::KeyNorm::none;
}

// Everything but the FAVOR++ / FAVOR# projection (set by the callers).
ResolvedMap resolve_common(const FeatureMap& map, int64_t d, int64_t head_count,
                           int64_t batch_heads, const std::vector<double>& decay, bool causal,
                           bool borrow) {
  check_feature_map(map, d, head_count, batch_heads);
  ResolvedMap r;
  r.kernel = map.kernel;
  r.m = map.m();
  r.d = map.d();
  r.scale = resolve_scale(map.scale, d);
  const std::vector<float>& w = map.weights.empty() ? map.projection.matrix() : map.weights;
  if (!map.weights.empty()) r.w_sets = map.heads;
  if (borrow) {
    r.w_view = w.data();
    r.w_view_size = w.size();
  } else {
    r.w = w;
  }
  if (!map.bias.empty()) {
    r.bias = map.bias;
    r.bias_sets = map.heads;
  }
  if (!map.lambda.empty()) {
    r.lambda_sets = map.heads;
    r.key_logw.resize(map.lambda.size());
    for (size_t i = 0; i < map.lambda.size(); ++i) {
      const double l = map.lambda[i];
      r.key_logw[i] = static_cast<float>(2.0 * std::log(std::fabs(l)));
    }
  }
  r.decay_rate = decay_rates(decay, head_count, causal);
  r.decay_sets = static_cast<int64_t>(std::max<size_t>(r.decay_rate.size(), 1));
  return r;
}

}  // namespace

uint64_t ResolvedMap::fingerprint() const {
  uint64_t h = 1469598103934665603ull;
  const int k = static_cast<int>(kernel);
  h = mix(h, &k, sizeof k);
  h = mix(h, &scale, sizeof scale);
  const float* wd = w_view ? w_view : w.data();
  const uint64_t wn = w_view ? w_view_size : w.size();
  h = mix(h, wd, wn * sizeof(float));
  h = mix(h, &wn, sizeof wn);
  h = mix(h, bias);
  h = mix(h, key_logw);
  h = mix(h, decay_rate);
  h = mix(h, adapted.w);
  h = mix(h, adapted.bias);
  return h;
}

kernels::FeatureParams ResolvedMap::params() const {
  kernels::FeatureParams p;
  p.kernel = kernel;
  p.m = m;
  p.d = d;
  p.sqrt_scale = static_cast<float>(std::sqrt(scale));
  p.key_norm = key_norm(kernel);
  if (adapted.heads) {
    p.w = adapted.w.data();
    p.w_sets = adapted.heads;
    p.bias = adapted.bias.data();
    p.bias_sets = adapted.heads;
  } else {
    p.w = w_view ? w_view : w.data();
    p.w_sets = w_sets;
    p.bias = bias.empty() ? nullptr : bias.data();
    p.bias_sets = bias_sets;
  }
  if (!key_logw.empty()) {
    p.key_logw = key_logw.data();
    p.lambda_sets = lambda_sets;
  }
  if (!decay_rate.empty()) {
    p.decay_rate = decay_rate.data();
    p.decay_sets = decay_sets;
  }
  return p;
}

void map_options_error(const char* function) {
  throw Error(std::string("options: ") + function +
              " with a FeatureMap takes the kernel, scale and fit from the map; leave "
              "options.kernel, options.scale and options.fit at their defaults");
}

std::vector<double> decay_rates(const std::vector<double>& decay, int64_t heads, bool causal,
                                const char* argument) {
  if (decay.empty()) return {};
  const std::string name = argument;
  if (!causal) {
    throw Error(name + ": decay gamma^(i - j) is defined for causal attention only (set causal)");
  }
  if (decay.size() != 1 && static_cast<int64_t>(decay.size()) != heads) {
    throw Error(name + ": has " + std::to_string(decay.size()) +
                " values; give 1 or one per head (" + std::to_string(heads) + ")");
  }
  std::vector<double> rates(decay.size());
  for (size_t i = 0; i < decay.size(); ++i) {
    const double g = decay[i];
    if (!(g > 0.0 && g <= 1.0)) {
      throw Error(name + "[" + std::to_string(i) + "] = " + std::to_string(g) +
                  ": gamma must lie in (0, 1]");
    }
    rates[i] = -std::log(g);  // gamma = 1: rate 0, and g + j * 0 = g bit for bit
  }
  return rates;
}

ResolvedMap resolve_map(const FeatureMap& map, const AttentionShape& s, const TensorView& q,
                        const TensorView& k, const AttentionOptions& options, bool borrow) {
  ResolvedMap r =
      resolve_common(map, s.d, s.heads, s.batch * s.heads, options.decay, options.causal, borrow);
  AttentionOptions fit_options;
  fit_options.kernel = map.kernel;
  fit_options.causal = options.causal;
  fit_options.key_mask = options.key_mask;
  fit_options.fit = map.fit;
  r.adapted = attention_projection(q, k, fit_options, r.scale, map.projection);
  return r;
}

ResolvedMap resolve_fixed_map(const FeatureMap& map, int64_t batch, int64_t heads,
                              const std::vector<double>& decay) {
  ResolvedMap r = resolve_common(map, map.d(), heads, batch * heads, decay, true, false);
  if (data_adapted(map.kernel)) {
    if (!map.fit) {
      throw Error("fit: a " + to_string(map.kernel) +
                  " decoder needs a fit (fit_kernel on calibration data, or KernelFit::constant)");
    }
    // 1, H (one per head: it follows a reordered batch, as a beam search needs) or B*H sets
    check_fit(*map.fit, map.d(), map.fit->heads == heads ? heads : batch * heads, "fit");
    r.adapted = adapt_projection(*map.fit, map.projection);
  }
  return r;
}

}  // namespace favor::detail
