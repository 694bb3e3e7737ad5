// favor::features on the CPU (kernels::FeaturesParams): the exact feature map (math.md s.2),
// all constants kept, no stabilisation, in tiles of kRowTile rows: gather (scaled), project,
// one feature row per token. Stops at the first row whose features overflow.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/feature_tile.hpp"
#include "cpu/tiles.hpp"

namespace favor::cpu {

kernels::FeatureOverflow exact_features(const kernels::FeaturesParams& p) {
  const FeatureParams& fp = p.map;
  const int64_t m = fp.m, d = fp.d, F = fp.features();
  std::vector<float> tile(kRowTile * d), a(kRowTile * m);
  std::vector<double> half_norm2(kRowTile);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h) {
      const int64_t bh = b * p.heads + h;
      const double head_const =
          p.head_log_const ? p.head_log_const[p.log_const_sets == 1 ? 0 : bh] : p.log_const;
      const float* lambda = p.lambda ? p.lambda + (bh % p.lambda_sets) * m : nullptr;
      const float* xh = p.x + b * p.x_strides[0] + h * p.x_strides[1];
      float* oh = p.out + bh * p.n * F;
      for (int64_t n0 = 0; n0 < p.n; n0 += kRowTile) {
        const int64_t rows = std::min(kRowTile, p.n - n0);
        gather_rows(xh + n0 * p.x_strides[2], p.x_strides[2], p.x_strides[3], rows, d,
                    fp.sqrt_scale, tile.data(), half_norm2.data());
        project_rows(tile.data(), rows, d, fp.head_w(bh), m, a.data(), fp.head_bias(bh));
        for (int64_t r = 0; r < rows; ++r) {
          // The positive family's exponent is a - |x|^2/2 + log_const; trig's factor is
          // exp(+|x|^2/2 + log_const): key_features with off = +-|x|^2/2 + log_const.
          const double off = fp.key_log_weight(half_norm2[r], bh, 0) + head_const;
          float* phi = oh + (n0 + r) * F;
          key_features(fp, bh, a.data() + r * m, off, phi);
          for (int64_t f = 0; lambda && f < F; ++f) phi[f] *= lambda[f % m];
          for (int64_t f = 0; f < F; ++f) {
            if (!std::isfinite(phi[f])) return {true, b, h, n0 + r, half_norm2[r]};
          }
        }
      }
    }
  return {};
}

}  // namespace favor::cpu
