// FeatureMap: the checks of its parameters and the learnable starting point.
#include "favor/feature_map.hpp"

#include <cmath>
#include <string>

#include "favor/error.hpp"

namespace favor {
namespace {

void check_set(const std::vector<float>& values, int64_t per_set, int64_t sets,
               const std::string& name, bool nonzero) {
  if (values.empty()) return;
  if (static_cast<int64_t>(values.size()) != sets * per_set) {
    throw Error(name + ": has " + std::to_string(values.size()) + " values; heads x " +
                std::to_string(per_set) + " = " + std::to_string(sets * per_set) + " expected");
  }
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i]) || (nonzero && values[i] == 0.0f)) {
      throw Error(name + "[" + std::to_string(i) + "] = " + std::to_string(values[i]) +
                  (nonzero ? ": feature weights must be finite and nonzero" : ": not finite"));
    }
  }
}

}  // namespace

FeatureMap& FeatureMap::learnable(int64_t sets, bool with_weights, bool with_bias,
                                  bool with_lambda) {
  if (sets < 1) throw Error("heads: " + std::to_string(sets) + " parameter sets; must be >= 1");
  // The parameters already set must be valid before they are widened.
  if (heads < 1) throw Error("heads: " + std::to_string(heads) + " parameter sets; must be >= 1");
  check_set(weights, m() * d(), heads, "weights", false);
  check_set(bias, m(), heads, "bias", false);
  check_set(lambda, m(), heads, "lambda", true);
  if (data_adapted(kernel)) {
    throw Error("kernel: " + to_string(kernel) +
                " takes its parameters from its fit; learn a positive or hedgehog map instead");
  }
  auto widen = [&](std::vector<float>& values, int64_t per_set, float init, const float* from) {
    std::vector<float> out(static_cast<size_t>(sets * per_set), init);
    for (int64_t s = 0; s < sets; ++s)
      for (int64_t i = 0; i < per_set; ++i) {
        if (!values.empty()) {
          out[s * per_set + i] = values[(heads == 1 ? 0 : s % heads) * per_set + i];
        } else if (from) {
          out[s * per_set + i] = from[i];
        }
      }
    values = std::move(out);
  };
  const int64_t md = m() * d();
  if (with_weights || !weights.empty()) widen(weights, md, 0.0f, projection.data());
  if (with_bias || !bias.empty()) widen(bias, m(), 0.0f, nullptr);
  if (with_lambda || !lambda.empty()) widen(lambda, m(), 1.0f, nullptr);
  heads = sets;
  return *this;
}

void check_feature_map(const FeatureMap& map, int64_t d, int64_t head_count, int64_t batch_heads,
                       const char* argument) {
  const std::string name = argument;
  if (map.d() != d) {
    throw Error(name + ": projection is " + std::to_string(map.m()) + " x " +
                std::to_string(map.d()) + " but the head dim D of q and k is " + std::to_string(d));
  }
  if (map.heads != 1 && map.heads != head_count && map.heads != batch_heads) {
    throw Error(name + ".heads = " + std::to_string(map.heads) + ": must be 1, H (" +
                std::to_string(head_count) + ") or B*H (" + std::to_string(batch_heads) + ")");
  }
  if (data_adapted(map.kernel) && map.learned()) {
    throw Error(name + ": a " + to_string(map.kernel) +
                " map takes its projections and biases from its fit; it cannot also have "
                "learned weights, bias or lambda");
  }
  check_set(map.weights, map.m() * map.d(), map.heads, name + ".weights", false);
  check_set(map.bias, map.m(), map.heads, name + ".bias", false);
  check_set(map.lambda, map.m(), map.heads, name + ".lambda", true);
}

}  // namespace favor
