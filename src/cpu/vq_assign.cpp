#include "cpu/vq_assign.hpp"

#include <cmath>
#include <limits>

#include "cpu/blas.hpp"
#include "cpu/vec_math.hpp"

namespace favor::cpu {

std::vector<float> code_norms(const float* codebook, int64_t codes, int64_t d) {
  std::vector<float> norms(static_cast<size_t>(codes));
  for (int64_t s = 0; s < codes; ++s) norms[s] = dot(codebook + s * d, codebook + s * d, d);
  return norms;
}

std::vector<float> all_code_norms(const VQParams& p) {
  const int64_t books = p.codebook_head_stride == 0 ? 1 : p.base.heads;
  std::vector<float> norms;
  norms.reserve(static_cast<size_t>(books * p.codes));
  for (int64_t g = 0; g < books; ++g) {
    const std::vector<float> n =
        code_norms(p.codebook + g * p.codebook_head_stride, p.codes, p.base.d);
    norms.insert(norms.end(), n.begin(), n.end());
  }
  return norms;
}

namespace {

// scores[r][s] = 2 x_r . C_s - |C_s|^2 = |x_r|^2 - |x_r - C_s|^2: larger is nearer.
void nearness(const float* x, int64_t ldx, int64_t n, int64_t d, const float* codebook,
              const float* norms, int64_t codes, float* scores) {
  gemm(false, true, n, codes, d, 2.0f, x, ldx, codebook, d, 0.0f, scores, codes);
  for (int64_t r = 0; r < n; ++r) {
    float* row = scores + r * codes;
    for (int64_t s = 0; s < codes; ++s) row[s] -= norms[s];
  }
}

}  // namespace

void nearest_codes(const float* x, int64_t ldx, int64_t n, int64_t d, const float* codebook,
                   const float* norms, int64_t codes, int32_t* z, float* dist2, float* scratch) {
  nearness(x, ldx, n, d, codebook, norms, codes, scratch);
  for (int64_t r = 0; r < n; ++r) {
    const float* row = scratch + r * codes;
    int64_t best = 0;
    for (int64_t s = 1; s < codes; ++s)
      if (row[s] > row[best]) best = s;
    z[r] = static_cast<int32_t>(best);
    if (dist2) {
      const float* xr = x + r * ldx;
      const float* c = codebook + best * d;
      double sum = 0.0;
      for (int64_t t = 0; t < d; ++t) sum += double(xr[t] - c[t]) * (xr[t] - c[t]);
      dist2[r] = static_cast<float>(sum);
    }
  }
}

void soft_log_assign(const float* x, int64_t ldx, int64_t n, int64_t d, const float* codebook,
                     const float* norms, int64_t codes, float tau, float* logp) {
  nearness(x, ldx, n, d, codebook, norms, codes, logp);
  const float inv_tau = 1.0f / tau;
  std::vector<float> e(static_cast<size_t>(codes));
  for (int64_t r = 0; r < n; ++r) {
    float* row = logp + r * codes;
    const float top = max_value(row, codes);
    for (int64_t s = 0; s < codes; ++s) row[s] = (row[s] - top) * inv_tau;  // <= 0, one is 0
    exp_affine(row, 1.0f, 0.0f, e.data(), codes);
    const float log_sum = std::log(sum_values(e.data(), codes));  // sum in [1, c]
    for (int64_t s = 0; s < codes; ++s) row[s] -= log_sum;
  }
}

void assign_rows(const float* x, int64_t n, int64_t d, const float* codebook, const float* norms,
                 int64_t codes, float tau, int32_t* z, float* p) {
  if (tau == 0.0f) {
    nearest_codes(x, d, n, d, codebook, norms, codes, z, nullptr, p);
    return;
  }
  soft_log_assign(x, d, n, d, codebook, norms, codes, tau, p);
  exp_affine(p, 1.0f, 0.0f, p, n * codes);
}

}  // namespace favor::cpu
