#pragma once
// A small dependency-free Adam (Kingma & Ba 2015) over one float vector: the optimiser of
// fit_features. Moments are kept in double, so that the result does not depend on how the
// gradient's scale rounds in float.
#include <cstddef>
#include <vector>

namespace favor::detail {

struct AdamOptions {
  double learning_rate = 0.01;
  double beta1 = 0.9, beta2 = 0.999, epsilon = 1e-8;
};

class Adam {
 public:
  Adam(size_t size, const AdamOptions& options) : o_(options), m_(size, 0.0), v_(size, 0.0) {}
  /// One step: m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2, and
  /// x -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps), t the number of steps so far.
  /// x and g hold size() floats.
  void step(float* x, const float* g);
  size_t size() const { return m_.size(); }

 private:
  AdamOptions o_;
  std::vector<double> m_, v_;
  double beta1_t_ = 1.0, beta2_t_ = 1.0;  // b1^t, b2^t
};

}  // namespace favor::detail
