#include "cpu/vq_assign.hpp"

#include <cmath>
#include <limits>

#include "cpu/blas.hpp"
#include "cpu/vec_math.hpp"

namespace favor::cpu {

CodeTable code_table(const float* codebook, int64_t codes, int64_t d) {
  CodeTable t;
  t.codes = codes;
  t.d = d;
  t.raw.assign(codebook, codebook + codes * d);
  std::vector<double> mean(static_cast<size_t>(d), 0.0);
  for (int64_t s = 0; s < codes; ++s)
    for (int64_t x = 0; x < d; ++x) mean[x] += codebook[s * d + x];
  t.mean.resize(static_cast<size_t>(d));
  for (int64_t x = 0; x < d; ++x) t.mean[x] = static_cast<float>(mean[x] / double(codes));
  t.centred.resize(static_cast<size_t>(codes * d));
  t.norms.resize(static_cast<size_t>(codes));
  for (int64_t s = 0; s < codes; ++s) {
    double n2 = 0.0;
    for (int64_t x = 0; x < d; ++x) {
      // The same float mean as the keys subtract (centred_rows): equal inputs stay equal.
      const double c = double(codebook[s * d + x]) - double(t.mean[x]);
      t.centred[s * d + x] = static_cast<float>(c);
      n2 += c * c;
    }
    t.norms[s] = static_cast<float>(n2);
  }
  return t;
}

std::vector<CodeTable> all_code_tables(const VQParams& p) {
  const int64_t books = p.codebook_head_stride == 0 ? 1 : p.base.heads;
  std::vector<CodeTable> tables;
  tables.reserve(static_cast<size_t>(books));
  for (int64_t g = 0; g < books; ++g)
    tables.push_back(code_table(p.codebook + g * p.codebook_head_stride, p.codes, p.base.d));
  return tables;
}

namespace {

// The n rows of x centred on the codebook's mean, in double and rounded once (n x d,
// contiguous).
std::vector<float> centred_rows(const float* x, int64_t ldx, int64_t n, const CodeTable& t) {
  const int64_t d = t.d;
  std::vector<float> out(static_cast<size_t>(n * d));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < d; ++c)
      out[r * d + c] = static_cast<float>(double(x[r * ldx + c]) - double(t.mean[c]));
  return out;
}

// scores[r][s] = 2 x_r . C_s - |C_s|^2 = |x_r|^2 - |x_r - C_s|^2 (centred): larger is nearer.
void nearness(const float* xc, int64_t n, const CodeTable& t, float* scores) {
  const int64_t c = t.codes;
  gemm(false, true, n, c, t.d, 2.0f, xc, t.d, t.centred.data(), t.d, 0.0f, scores, c);
  for (int64_t r = 0; r < n; ++r) {
    float* row = scores + r * c;
    for (int64_t s = 0; s < c; ++s) row[s] -= t.norms[s];
  }
}

}  // namespace

void nearest_codes(const float* x, int64_t ldx, int64_t n, const CodeTable& t, int32_t* z,
                   float* dist2, float* scratch) {
  const int64_t c = t.codes, d = t.d;
  nearness(centred_rows(x, ldx, n, t).data(), n, t, scratch);
  for (int64_t r = 0; r < n; ++r) {
    const float* row = scratch + r * c;
    int64_t best = 0;
    for (int64_t s = 1; s < c; ++s)
      if (row[s] > row[best]) best = s;
    z[r] = static_cast<int32_t>(best);
    if (dist2) {  // from the given values: one rounding
      const float* xr = x + r * ldx;
      const float* code = t.raw.data() + best * d;
      double sum = 0.0;
      for (int64_t k = 0; k < d; ++k) sum += (double(xr[k]) - code[k]) * (double(xr[k]) - code[k]);
      dist2[r] = static_cast<float>(sum);
    }
  }
}

void soft_log_assign(const float* x, int64_t ldx, int64_t n, const CodeTable& t, float tau,
                     float* logp) {
  const int64_t c = t.codes;
  nearness(centred_rows(x, ldx, n, t).data(), n, t, logp);
  const float inv_tau = 1.0f / tau;
  std::vector<float> e(static_cast<size_t>(c));
  for (int64_t r = 0; r < n; ++r) {
    float* row = logp + r * c;
    const float top = max_value(row, c);
    for (int64_t s = 0; s < c; ++s) row[s] = (row[s] - top) * inv_tau;  // <= 0, one is 0
    exp_affine(row, 1.0f, 0.0f, e.data(), c);
    const float log_sum = std::log(sum_values(e.data(), c));  // sum in [1, c]
    for (int64_t s = 0; s < c; ++s) row[s] -= log_sum;
  }
}

void assign_rows(const float* x, int64_t n, const CodeTable& t, float tau, int32_t* z, float* p) {
  if (tau == 0.0f) {
    nearest_codes(x, t.d, n, t, z, nullptr, p);
    return;
  }
  soft_log_assign(x, t.d, n, t, tau, p);
  exp_affine(p, 1.0f, 0.0f, p, n * t.codes);
}

}  // namespace favor::cpu
