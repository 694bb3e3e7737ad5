#include "core/adam.hpp"

#include <cmath>

namespace favor::detail {

void Adam::step(float* x, const float* g) {
  beta1_t_ *= o_.beta1;
  beta2_t_ *= o_.beta2;
  const double c1 = 1.0 - beta1_t_, c2 = 1.0 - beta2_t_;
  for (size_t i = 0; i < m_.size(); ++i) {
    const double gi = g[i];
    m_[i] = o_.beta1 * m_[i] + (1.0 - o_.beta1) * gi;
    v_[i] = o_.beta2 * v_[i] + (1.0 - o_.beta2) * gi * gi;
    const double update = o_.learning_rate * (m_[i] / c1) / (std::sqrt(v_[i] / c2) + o_.epsilon);
    x[i] = static_cast<float>(x[i] - update);
  }
}

}  // namespace favor::detail
