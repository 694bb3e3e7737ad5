#include "favor/reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/adapted.hpp"
#include "core/feature_map_params.hpp"
#include "core/validate.hpp"
#include "favor/error.hpp"
#include "reference/naive.hpp"
#include "reference/naive_grad.hpp"

namespace favor::reference {

DTensor features(TensorView x, const FeatureMap& map) {
  detail::check_view(x, "x");
  detail::check_projection(map.projection, x.shape[3], "x");
  check_feature_map(map, x.shape[3], x.shape[1], x.shape[0] * x.shape[1]);
  const double scale = detail::resolve_scale(map.scale, x.shape[3]);
  if (data_adapted(map.kernel)) {
    if (!map.fit) throw Error("fit: the " + to_string(map.kernel) + " kernel needs a fit");
    detail::check_fit(*map.fit, x.shape[3], x.shape[0] * x.shape[1], "fit");
  }
  DTensor out{{x.shape[0], x.shape[1], x.shape[2], map.features()}, {}};
  for (int64_t b = 0; b < x.shape[0]; ++b)
    for (int64_t h = 0; h < x.shape[1]; ++h) {
      const auto phi = naive::head_features<double>(x, b, h, map, scale, map.fit);
      out.values.insert(out.values.end(), phi.begin(), phi.end());
    }
  return out;
}

DTensor features(TensorView x, const Projection& w, const FeatureOptions& options) {
  FeatureMap map(w, options.kernel);
  map.scale = options.scale;
  map.fit = options.fit;
  return reference::features(x, map);
}

DTensor favor_attention(TensorView q, TensorView k, TensorView v, const FeatureMap& map,
                        const AttentionOptions& options) {
  detail::check_map_options(options, "reference::favor_attention");
  const auto s = detail::check_attention_inputs(q, k, v, options.causal, options.key_mask);
  detail::check_projection(map.projection, s.d, "q and k");
  check_feature_map(map, s.d, s.heads, s.batch * s.heads);
  detail::resolve_scale(map.scale, s.d);                        // the rules only
  detail::decay_rates(options.decay, s.heads, options.causal);  // the rules only
  if (data_adapted(map.kernel) && map.fit) {
    detail::check_fit(*map.fit, s.d, s.batch * s.heads, "fit");
  }
  return DTensor{{s.batch, s.heads, s.nq, s.dv},
                 naive::favor_attention<double>(q, k, v, map, options)};
}

DTensor favor_attention(TensorView q, TensorView k, TensorView v, const Projection& w,
                        const AttentionOptions& options) {
  return reference::favor_attention(q, k, v, detail::map_of(w, options),
                                    detail::without_map(options));
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

DGrads favor_attention_backward(TensorView q, TensorView k, TensorView v, TensorView dy,
                                const Projection& w, const AttentionOptions& options) {
  const auto s = detail::check_attention_inputs(q, k, v, options.causal, options.key_mask);
  detail::check_projection(w, s.d, "q and k");
  const double scale = detail::resolve_scale(options.scale, s.d);
  DGrads g = naive::zero_grads(s);
  g.dw.assign(static_cast<size_t>(w.m() * w.d()), 0.0);
  const std::optional<KernelFit> fit = naive::attention_fit(q, k, options, scale);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      // FAVOR++ / FAVOR#: the gradient through W_h and the bias, then through their
      // construction from W (head_map_backward), the fit held fixed.
      const naive::HeadMap map = naive::head_map(w, options.kernel, fit, b * s.heads + h);
      naive::Head<double> head{s.nq,
                               s.nk,
                               s.d,
                               s.dv,
                               w.m(),
                               naive::head_rows<double>(q, b, h),
                               naive::head_rows<double>(k, b, h),
                               naive::head_rows<double>(v, b, h),
                               map.w,
                               {},
                               data_adapted(options.kernel) ? map.bias : std::vector<double>{},
                               {},
                               1.0};
      head.mask = naive::head_mask(options.key_mask, b, s.nk);
      const auto hg = naive::backward(head, naive::head_rows<double>(dy, b, h), options.kernel,
                                      scale, options.causal);
      naive::put_head(g.dq, b, h, hg.dq);
      naive::put_head(g.dk, b, h, hg.dk);
      naive::put_head(g.dv, b, h, hg.dv);
      naive::head_map_backward(w, options.kernel, fit, b * s.heads + h, hg.dw, hg.dbias, g.dw);
    }
  return g;
}

DGrads favor_attention_backward(TensorView q, TensorView k, TensorView v, TensorView dy,
                                const FeatureMap& map, const AttentionOptions& options) {
  detail::check_map_options(options, "reference::favor_attention_backward");
  const auto s = detail::check_attention_inputs(q, k, v, options.causal, options.key_mask);
  detail::check_dy(dy, s);
  detail::check_projection(map.projection, s.d, "q and k");
  check_feature_map(map, s.d, s.heads, s.batch * s.heads);
  detail::decay_rates(options.decay, s.heads, options.causal);  // the decay's checks
  const double scale = detail::resolve_scale(map.scale, s.d);
  AttentionOptions o = options;
  o.kernel = map.kernel;
  o.fit = map.fit;
  const std::optional<KernelFit> fit = naive::attention_fit(q, k, o, scale);
  auto mg = naive::map_backward<double>(q, k, v, dy, map, options, scale, fit);
  DGrads g = naive::zero_grads(s);
  g.dq.values = std::move(mg.dq);
  g.dk.values = std::move(mg.dk);
  g.dv.values = std::move(mg.dv);
  g.dw = std::move(mg.dw);
  g.dbias = std::move(mg.dbias);
  g.dlambda = std::move(mg.dlambda);
  g.ddecay = std::move(mg.ddecay);
  return g;
}

DGrads exact_attention_backward(TensorView q, TensorView k, TensorView v, TensorView dy,
                                const ExactOptions& options) {
  const auto s = detail::check_attention_inputs(q, k, v, options.causal, options.key_mask);
  const double scale = detail::resolve_scale(options.scale, s.d);
  DGrads g = naive::zero_grads(s);
  std::vector<double> p(static_cast<size_t>(s.nk)), dp(static_cast<size_t>(s.nk));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < s.nq; ++i) {
        // P = softmax row, dP = dy V^T, dS = P (dP - sum_j P dP), dq = scale dS K, dk += scale dS
        // q.
        double mx = -INFINITY;
        for (int64_t j = 0; j < s.nk; ++j) {
          const bool visible =
              !(options.causal && j > i) && naive::key_visible(options.key_mask, b, j);
          double dot = 0.0;
          for (int64_t t = 0; t < s.d; ++t) dot += double(q.at(b, h, i, t)) * k.at(b, h, j, t);
          p[j] = visible ? scale * dot : -INFINITY;
          mx = std::max(mx, p[j]);
        }
        if (std::isinf(mx)) continue;
        double den = 0.0;
        for (int64_t j = 0; j < s.nk; ++j) den += (p[j] = std::exp(p[j] - mx));
        double mean = 0.0;
        for (int64_t j = 0; j < s.nk; ++j) {
          p[j] /= den;
          dp[j] = 0.0;
          for (int64_t x = 0; x < s.dv; ++x) dp[j] += double(dy.at(b, h, i, x)) * v.at(b, h, j, x);
          mean += p[j] * dp[j];
        }
        for (int64_t j = 0; j < s.nk; ++j) {
          const double ds = p[j] * (dp[j] - mean);
          for (int64_t t = 0; t < s.d; ++t) {
            g.dq.values[((b * s.heads + h) * s.nq + i) * s.d + t] += scale * ds * k.at(b, h, j, t);
            g.dk.values[((b * s.heads + h) * s.nk + j) * s.d + t] += scale * ds * q.at(b, h, i, t);
          }
          for (int64_t x = 0; x < s.dv; ++x)
            g.dv.values[((b * s.heads + h) * s.nk + j) * s.dv + x] += p[j] * dy.at(b, h, i, x);
        }
      }
  return g;
}

}  // namespace favor::reference
