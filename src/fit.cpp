// fit_features: distillation of a feature map's learned parameters (W, b, lambda) against
// exact attention, by Adam on the output MSE with gradients from favor's own backward pass
// (or on FitOptions::objective: the Python fit's KL), and the rules it shares with its callers
// (the options, the lambda floor, the holdout count).
#include "favor/fit.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "core/adam.hpp"
#include "favor/backward.hpp"
#include "favor/error.hpp"
#include "favor/metrics.hpp"

namespace favor {
namespace {

using Clock = std::chrono::steady_clock;

std::string str(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

// Exact attention of `data` with the map's scale: the target. Errors name `which`.
Tensor exact_target(const FitData& data, const FeatureMap& map, bool causal, const char* which) {
  ExactOptions o;
  o.causal = causal;
  o.scale = map.scale;
  o.key_mask = data.key_mask;
  o.accumulation = Accumulation::f64;  // computed once: the best target for its cost
  try {
    return exact_attention(data.q, data.k, data.v, o);
  } catch (const Error& e) {
    throw Error(std::string(which) + ": " + e.what());
  }
}

void check_heldout(const FitData& train, const FitData& heldout) {
  const Shape4 &tq = train.q.shape, &hq = heldout.q.shape, &tv = train.v.shape,
               &hv = heldout.v.shape;
  if (tq[1] != hq[1] || tq[3] != hq[3] || tv[3] != hv[3]) {
    throw Error("heldout: q " + shape_string(hq) + ", v " + shape_string(hv) + " and train: q " +
                shape_string(tq) + ", v " + shape_string(tv) +
                " must have the same heads H, head dim D and value dim Dv");
  }
}

// The starting map made learnable: refuses FAVOR++ / FAVOR# and per-sequence sets, then gives
// it every parameter set the options learn (one per head unless it already has shared sets).
FeatureMap learnable_start(FeatureMap map, const FitOptions& o, int64_t d, int64_t heads) {
  if (data_adapted(map.kernel)) {
    throw Error("start: a " + to_string(map.kernel) +
                " map takes its parameters from its fit and has nothing to learn; fit a positive, "
                "trig, hyperbolic or hedgehog map");
  }
  if (map.learned() && map.heads != 1 && map.heads != heads) {
    throw Error("start.heads = " + std::to_string(map.heads) + ": a map to fit has 1 or H (" +
                std::to_string(heads) +
                ") parameter sets; per-sequence sets would not carry over to other sequences");
  }
  check_feature_map(map, d, heads, heads, "start");
  map.learnable(map.learned() ? map.heads : heads, o.learn_weights, o.learn_bias, o.learn_lambda);
  return map;
}

// One learned parameter set, its optimiser and where its gradient comes from.
struct Learned {
  std::vector<float>* values;
  std::vector<float> AttentionGrads::*grad;
  const char* name;
  detail::Adam adam;
};

}  // namespace

void check_fit_options(const FitOptions& o) {
  if (o.steps < 0) throw Error("options.steps: " + std::to_string(o.steps) + " must be >= 0");
  if (!(std::isfinite(o.learning_rate) && o.learning_rate > 0.0))
    throw Error("options.learning_rate: " + str(o.learning_rate) + " must be finite and > 0");
  if (!(o.beta1 >= 0.0 && o.beta1 < 1.0))
    throw Error("options.beta1: " + str(o.beta1) + " must lie in [0, 1)");
  if (!(o.beta2 >= 0.0 && o.beta2 < 1.0))
    throw Error("options.beta2: " + str(o.beta2) + " must lie in [0, 1)");
  if (!(std::isfinite(o.epsilon) && o.epsilon > 0.0))
    throw Error("options.epsilon: " + str(o.epsilon) + " must be finite and > 0");
  if (!(std::isfinite(o.lambda_floor) && o.lambda_floor > 0.0))
    throw Error("options.lambda_floor: " + str(o.lambda_floor) + " must be finite and > 0");
  if (o.eval_every < 0)
    throw Error("options.eval_every: " + std::to_string(o.eval_every) + " must be >= 0");
  if (!o.learn_weights && !o.learn_bias && !o.learn_lambda) {
    throw Error(
        "options: learn_weights, learn_bias and learn_lambda are all false; there is nothing to "
        "fit");
  }
}

void floor_lambda(float* lambda, size_t n, double floor) {
  const auto f = static_cast<float>(floor);
  for (size_t i = 0; i < n; ++i)
    if (std::fabs(lambda[i]) < f) lambda[i] = std::copysign(f, lambda[i]);
}

int64_t heldout_count(double fraction, int64_t n, const std::string& name) {
  if (!(fraction > 0.0 && fraction < 1.0))
    throw Error(name + ": " + str(fraction) + " must lie in (0, 1)");
  if (n < 2) {
    throw Error(name + ": " + str(fraction) + " of " + std::to_string(n) +
                " leaves none to train on (holding some out needs 2 or more)");
  }
  return std::clamp<int64_t>(std::llround(fraction * static_cast<double>(n)), 1, n - 1);
}

FitResult fit_features(const FitData& train, const FitData& heldout, FeatureMap start,
                       const FitOptions& options,
                       const std::function<void(const FitStep&)>& on_step) {
  const Clock::time_point began = Clock::now();
  check_fit_options(options);
  const Tensor train_target = exact_target(train, start, options.causal, "train");
  const Tensor heldout_target = exact_target(heldout, start, options.causal, "heldout");
  check_heldout(train, heldout);
  FitResult result{learnable_start(std::move(start), options, train.q.shape[3], train.q.shape[1]),
                   {}};
  FeatureMap& map = result.map;

  const detail::AdamOptions adam{options.learning_rate, options.beta1, options.beta2,
                                 options.epsilon};
  std::vector<Learned> learned;
  if (options.learn_weights)
    learned.push_back({&map.weights, &AttentionGrads::dw, "weights", {map.weights.size(), adam}});
  if (options.learn_bias)
    learned.push_back({&map.bias, &AttentionGrads::dbias, "bias", {map.bias.size(), adam}});
  if (options.learn_lambda)
    learned.push_back({&map.lambda, &AttentionGrads::dlambda, "lambda", {map.lambda.size(), adam}});

  AttentionOptions train_options, heldout_options;
  train_options.causal = heldout_options.causal = options.causal;
  train_options.key_mask = train.key_mask;
  heldout_options.key_mask = heldout.key_mask;
  Tensor y(train_target.shape()), dy(train_target.shape());
  const auto numel = static_cast<size_t>(y.numel());
  const float* target = train_target.data();
  for (int step = 0;; ++step) {
    // The loss of the map after `step` updates (and, for the output MSE, its gradient dL/dy).
    AttentionContext context;
    AttentionGrads grads;
    double loss = 0.0;
    if (options.objective) {
      loss = options.objective(map, grads);
    } else {
      favor_attention(train.q, train.k, train.v, map, y.mutable_view(), train_options,
                      options.causal ? nullptr : &context);
      double sum = 0.0;
      for (size_t i = 0; i < numel; ++i) {
        const double e = static_cast<double>(y.data()[i]) - target[i];
        sum += e * e;
        dy.data()[i] = static_cast<float>(2.0 * e / static_cast<double>(numel));
      }
      loss = sum / static_cast<double>(numel);
    }
    if (!std::isfinite(loss)) {
      throw Error("fit_features: step " + std::to_string(step) + ": the training loss is " +
                  str(loss) + "; lower the learning rate");
    }
    const bool evaluated = step == 0 || step == options.steps ||
                           (options.eval_every > 0 && step % options.eval_every == 0);
    if (evaluated) {
      FitStep record;
      record.step = step;
      record.loss = loss;
      record.heldout_error = relative_frobenius_error(
          favor_attention(heldout.q, heldout.k, heldout.v, map, heldout_options), heldout_target);
      record.seconds = std::chrono::duration<double>(Clock::now() - began).count();
      result.history.push_back(record);
      if (on_step) on_step(record);
    }
    if (step == options.steps) break;

    // Backward (the output MSE's) and one Adam step on every learned set.
    if (!options.objective) {
      grads = favor_attention_backward(train.q, train.k, train.v, dy, map, train_options, true,
                                       options.causal ? nullptr : &context);
    }
    for (Learned& l : learned) {
      const std::vector<float>& g = grads.*l.grad;
      if (g.size() != l.values->size()) {
        if (options.objective) {
          throw Error("fit_features: step " + std::to_string(step) + ": the objective gave " +
                      std::to_string(g.size()) + " gradients for " + l.name + " (" +
                      std::to_string(l.values->size()) + " values)");
        }
        throw std::logic_error(std::string("fit_features: the backward pass gave ") +
                               std::to_string(g.size()) + " gradients for " + l.name + " (" +
                               std::to_string(l.values->size()) + " values)");
      }
      l.adam.step(l.values->data(), g.data());
      for (float& x : *l.values) {
        if (!std::isfinite(x)) {
          throw Error("fit_features: step " + std::to_string(step + 1) + ": the update made " +
                      l.name + " non-finite; lower the learning rate");
        }
      }
    }
    if (options.learn_lambda)
      floor_lambda(map.lambda.data(), map.lambda.size(), options.lambda_floor);
  }
  return result;
}

}  // namespace favor
