#include "favor/reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/validate.hpp"
#include "reference/naive.hpp"

namespace favor::reference {

DTensor features(TensorView x, const Projection& w, const FeatureOptions& options) {
  detail::check_view(x, "x");
  detail::check_projection(w, x.shape[3], "x");
  const double scale = detail::resolve_scale(options.scale, x.shape[3]);
  const int64_t F = feature_count(options.kernel, w.m());
  DTensor out{{x.shape[0], x.shape[1], x.shape[2], F}, {}};
  for (int64_t b = 0; b < x.shape[0]; ++b)
    for (int64_t h = 0; h < x.shape[1]; ++h) {
      const auto phi = naive::head_features<double>(x, b, h, w, options.kernel, scale);
      out.values.insert(out.values.end(), phi.begin(), phi.end());
    }
  return out;
}

DTensor favor_attention(TensorView q, TensorView k, TensorView v, const Projection& w,
                        const AttentionOptions& options) {
  const auto s = detail::check_attention_inputs(q, k, v, options.causal, options.key_mask);
  detail::check_projection(w, s.d, "q and k");
  AttentionOptions o = options;
  o.scale = detail::resolve_scale(options.scale, s.d);
  return DTensor{{s.batch, s.heads, s.nq, s.dv}, naive::favor_attention<double>(q, k, v, w, o)};
}

DTensor exact_attention(TensorView q, TensorView k, TensorView v, const ExactOptions& options) {
  const auto s = detail::check_attention_inputs(q, k, v, options.causal, options.key_mask);
  const double scale = detail::resolve_scale(options.scale, s.d);
  DTensor out{{s.batch, s.heads, s.nq, s.dv},
              std::vector<double>(static_cast<size_t>(s.batch * s.heads * s.nq * s.dv))};
  std::vector<double> scores(static_cast<size_t>(s.nk));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < s.nq; ++i) {
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < s.nk; ++j) {
          const bool visible =
              !(options.causal && j > i) && naive::key_visible(options.key_mask, b, j);
          double dot = 0.0;
          for (int64_t t = 0; t < s.d; ++t)
            dot += static_cast<double>(q.at(b, h, i, t)) * k.at(b, h, j, t);
          scores[j] = visible ? scale * dot : -std::numeric_limits<double>::infinity();
          mx = std::max(mx, scores[j]);
        }
        double* dst = out.values.data() + ((b * s.heads + h) * s.nq + i) * s.dv;
        if (std::isinf(mx)) continue;  // no visible key: zeros
        double den = 0.0;
        for (int64_t j = 0; j < s.nk; ++j) {
          const double p = std::exp(scores[j] - mx);
          den += p;
          for (int64_t x = 0; x < s.dv; ++x) dst[x] += p * v.at(b, h, j, x);
        }
        for (int64_t x = 0; x < s.dv; ++x) dst[x] /= den;
      }
  return out;
}

}  // namespace favor::reference
