// FAVOR++ and FAVOR# (math.md s.2): the optimal A, fitting per (batch, head), and the
// effective per-head projections the positive kernels run with.
#include "favor/estimators.hpp"

#include <Eigen/Eigenvalues>
#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/adapted.hpp"
#include "core/helper_threads.hpp"
#include "core/validate.hpp"
#include "favor/error.hpp"
#include "favor/features.hpp"
#include "favor/runtime.hpp"
#include "kernels/backend.hpp"

namespace favor {
namespace {

// Second-moment doubles per row set: d x d (FAVOR#) or the squared norm (FAVOR++).
int64_t second_size(Kernel kernel, int64_t d) {
  return kernel == Kernel::favorsharp ? d * d : 1;
}

// One head's moments of one row set inside a KernelMoments record: count, sum (d), second.
struct Moments {
  double* count;
  double* sum;
  double* second;
};

Moments moments_at(KernelMoments& mo, int64_t bh, int which) {
  const int64_t d = mo.d, size = 1 + d + second_size(mo.kernel, d);
  double* base = mo.sums.data() + bh * mo.record() + which * size;
  return {base, base + 1, base + 1 + d};
}

// P = M1 + M2 + mu1 mu2^T + mu2 mu1^T (full) or its trace / d (FAVOR++'s rho).
void fit_head(Kernel kernel, const Moments& mq, const Moments& mk, int64_t d, double* a,
              double* basis) {
  const double nq = std::max(*mq.count, 1.0);
  const double nk = std::max(*mk.count, 1.0);
  if (kernel == Kernel::favorpp) {
    double cross = 0.0;
    for (int64_t t = 0; t < d; ++t) cross += (mq.sum[t] / nq) * (mk.sum[t] / nk);
    const double rho = std::max(0.0, (mq.second[0] / nq + mk.second[0] / nk + 2.0 * cross) / d);
    const double value = optimal_a(rho);
    for (int64_t l = 0; l < d; ++l) {
      a[l] = value;
      for (int64_t r = 0; r < d; ++r) basis[r * d + l] = r == l ? 1.0 : 0.0;
    }
    return;
  }
  Eigen::MatrixXd p(d, d);
  for (int64_t r = 0; r < d; ++r)
    for (int64_t c = 0; c < d; ++c) {
      const double mu = (mq.sum[r] / nq) * (mk.sum[c] / nk) + (mk.sum[r] / nk) * (mq.sum[c] / nq);
      p(r, c) = mq.second[r * d + c] / nq + mk.second[r * d + c] / nk + mu;
    }
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eig(p);
  const Eigen::VectorXd& s = eig.eigenvalues();
  const Eigen::MatrixXd& q = eig.eigenvectors();
  for (int64_t l = 0; l < d; ++l) {
    a[l] = optimal_a(std::max(0.0, s(l)));  // P is PSD; clip rounding below zero
    for (int64_t r = 0; r < d; ++r) basis[r * d + l] = q(r, l);
  }
}

void check_adapted(Kernel kernel) {
  if (!data_adapted(kernel)) {
    throw Error("kernel: '" + to_string(kernel) +
                "' has no parameters to fit; fit_kernel applies to favorpp and favorsharp");
  }
}

}  // namespace

double optimal_a(double rho) {
  if (!(rho >= 0.0) || !std::isfinite(rho)) {
    throw Error("rho: " + std::to_string(rho) + "; the mean |x + y|^2 / d must be finite and >= 0");
  }
  return (1.0 - 2.0 * rho - std::sqrt((2.0 * rho + 1.0) * (2.0 * rho + 1.0) + 8.0 * rho)) / 16.0;
}

double iid_mse(Kernel kernel, const double* x, const double* y, int64_t d, int64_t m,
               const KernelFit* fit, int64_t head) {
  if (m < 1) throw Error("m: " + std::to_string(m) + " projections; m must be >= 1");
  double xx = 0.0, yy = 0.0, xy = 0.0;
  for (int64_t t = 0; t < d; ++t) {
    xx += x[t] * x[t];
    yy += y[t] * y[t];
    xy += x[t] * y[t];
  }
  const double zz = xx + yy + 2.0 * xy, dd = xx + yy - 2.0 * xy, sm = std::exp(xy);
  const double positive = std::exp(2.0 * zz - xx - yy) - sm * sm;  // Var_1, FAVOR+
  switch (kernel) {
    case Kernel::positive:
      return positive / m;
    case Kernel::trig:
      return std::exp(zz) / (sm * sm) * std::pow(-std::expm1(-dd), 2) / (2.0 * m);
    case Kernel::hyperbolic:
      return -0.5 * std::expm1(-zz) * positive / m;
    case Kernel::hedgehog:
      throw Error(
          "kernel: hedgehog is a learned map, not an estimator of exp(x.y): it has no "
          "closed-form MSE");
    case Kernel::favorpp:
    case Kernel::favorsharp:
      break;
  }
  if (!fit) throw Error("fit: the closed-form MSE of " + to_string(kernel) + " needs its fit");
  detail::check_fit(*fit, d, fit->heads, "fit");
  if (head < 0 || head >= fit->heads) {
    throw Error("head: " + std::to_string(head) + " is not a head of the fit");
  }
  // Second moment per eigen-direction l of u = Q^T z (docs/estimators.md):
  // prod_l (1-4A_l)(1-8A_l)^(-1/2) exp(2(1-4A_l)/(1-8A_l) u_l^2) * exp(-|x|^2 - |y|^2).
  const double* a = fit->a.data() + head * d;
  const double* q = fit->basis.data() + head * d * d;
  double log_m2 = -xx - yy;
  for (int64_t l = 0; l < d; ++l) {
    double u = 0.0;
    for (int64_t t = 0; t < d; ++t) u += q[t * d + l] * (x[t] + y[t]);
    log_m2 += std::log1p(-4.0 * a[l]) - 0.5 * std::log1p(-8.0 * a[l]) +
              2.0 * (1.0 - 4.0 * a[l]) / (1.0 - 8.0 * a[l]) * u * u;
  }
  return (std::exp(log_m2) - sm * sm) / m;
}

KernelFit KernelFit::constant(double a, int64_t d) {
  if (d < 1) throw Error("d: " + std::to_string(d) + " head dim; d must be >= 1");
  KernelFit fit;
  fit.heads = 1;
  fit.d = d;
  fit.a.assign(static_cast<size_t>(d), a);
  fit.basis.assign(static_cast<size_t>(d * d), 0.0);
  for (int64_t l = 0; l < d; ++l) fit.basis[static_cast<size_t>(l * d + l)] = 1.0;
  detail::check_fit(fit, d, 1, "a");
  return fit;
}

int64_t KernelMoments::record() const {
  return 2 * (1 + d + second_size(kernel, d));
}

KernelMoments KernelMoments::zeros(Kernel kernel, int64_t heads, int64_t d) {
  check_adapted(kernel);
  KernelMoments mo;
  mo.kernel = kernel;
  mo.heads = heads;
  mo.d = d;
  mo.sums.assign(static_cast<size_t>(heads * mo.record()), 0.0);
  return mo;
}

KernelMoments kernel_moments(Kernel kernel, TensorView q, TensorView k, std::optional<double> scale,
                             std::optional<KeyMaskView> key_mask) {
  check_adapted(kernel);
  // Shapes as attention checks them, with empty slices (N = 0) allowed.
  const auto s = detail::check_slice_inputs(q, k, k, false, key_mask);
  const double sqrt_scale = std::sqrt(detail::resolve_scale(scale, s.d));
  const int64_t d = s.d, heads = s.batch * s.heads;
  KernelMoments mo = KernelMoments::zeros(kernel, heads, d);
  kernels::MomentsParams p{};
  kernels::AttentionParams& rows = p.rows;
  rows.q = q.data;
  rows.q_strides = q.strides;
  rows.k = k.data;
  rows.k_strides = k.strides;
  rows.batch = s.batch;
  rows.heads = s.heads;
  rows.nq = s.nq;
  rows.nk = s.nk;
  rows.d = d;
  if (key_mask) {
    rows.mask = key_mask->data;
    rows.mask_stride_b = key_mask->stride_b;
    rows.mask_stride_n = key_mask->stride_n;
  }
  p.sqrt_scale = sqrt_scale;
  p.full = kernel == Kernel::favorsharp;
  p.sums = mo.sums.data();
  kernels::backend().kernel_moments(p);
  return mo;
}

KernelFit fit_from_moments(const KernelMoments& moments) {
  check_adapted(moments.kernel);
  if (moments.heads < 1 || moments.d < 1 ||
      moments.sums.size() != static_cast<size_t>(moments.heads * moments.record())) {
    throw Error("moments: " + std::to_string(moments.sums.size()) + " sums for " +
                std::to_string(moments.heads) + " heads of d = " + std::to_string(moments.d) +
                "; need heads, d >= 1 and heads x record() sums");
  }
  for (double x : moments.sums) {
    if (!std::isfinite(x)) throw Error("moments: the sums must be finite");
  }
  const int64_t d = moments.d, heads = moments.heads;
  KernelFit fit;
  fit.heads = heads;
  fit.d = d;
  fit.a.resize(static_cast<size_t>(heads * d));
  fit.basis.resize(static_cast<size_t>(heads * d * d));
  KernelMoments& mo = const_cast<KernelMoments&>(moments);  // moments_at only reads here
  const int team = detail::helper_team();
#pragma omp parallel for schedule(dynamic) num_threads(team)
  for (int64_t bh = 0; bh < heads; ++bh) {
    fit_head(moments.kernel, moments_at(mo, bh, 0), moments_at(mo, bh, 1), d, fit.a.data() + bh * d,
             fit.basis.data() + bh * d * d);
  }
  detail::team_ran(team);
  return fit;
}

KernelFit fit_kernel(Kernel kernel, TensorView q, TensorView k, std::optional<double> scale,
                     std::optional<KeyMaskView> key_mask) {
  check_adapted(kernel);
  detail::check_attention_inputs(q, k, k, false, key_mask);
  return fit_from_moments(kernel_moments(kernel, q, k, scale, key_mask));
}

namespace detail {

void check_fit(const KernelFit& fit, int64_t d, int64_t heads, const std::string& argument) {
  std::ostringstream os;
  os << argument << ": ";
  if (fit.d != d) {
    os << "the fit is for head dim " << fit.d << ", the inputs have D = " << d;
    throw Error(os.str());
  }
  if (fit.heads != 1 && fit.heads != heads) {
    os << "the fit has " << fit.heads << " heads; it must have 1 or B*H = " << heads;
    throw Error(os.str());
  }
  if (fit.a.size() != static_cast<size_t>(fit.heads * d) ||
      fit.basis.size() != static_cast<size_t>(fit.heads * d * d)) {
    os << "a must hold heads*d = " << fit.heads * d
       << " values and basis heads*d*d = " << fit.heads * d * d << " (got " << fit.a.size()
       << " and " << fit.basis.size() << ")";
    throw Error(os.str());
  }
  for (size_t i = 0; i < fit.a.size(); ++i) {
    if (!std::isfinite(fit.a[i]) || !(fit.a[i] < 0.125)) {
      os << "A[" << i / static_cast<size_t>(d) << ',' << i % static_cast<size_t>(d)
         << "] = " << fit.a[i] << "; every A must be finite and < 1/8";
      throw Error(os.str());
    }
  }
  for (int64_t g = 0; g < fit.heads; ++g) {
    const double* q = fit.basis.data() + g * d * d;
    for (int64_t i = 0; i < d; ++i)
      for (int64_t j = 0; j <= i; ++j) {
        double dot = 0.0;
        for (int64_t r = 0; r < d; ++r) dot += q[r * d + i] * q[r * d + j];
        if (!(std::abs(dot - (i == j ? 1.0 : 0.0)) <= 1e-6)) {
          os << "basis of head " << g << " is not orthonormal (columns " << i << ", " << j
             << " have inner product " << dot << ")";
          throw Error(os.str());
        }
      }
  }
}

namespace {

bool is_identity(const double* q, int64_t d) {
  for (int64_t r = 0; r < d; ++r)
    for (int64_t l = 0; l < d; ++l)
      if (q[r * d + l] != (r == l ? 1.0 : 0.0)) return false;
  return true;
}

}  // namespace

AdaptedProjection adapt_projection(const KernelFit& fit, const Projection& w) {
  const int64_t m = w.m(), d = w.d();
  AdaptedProjection out;
  out.heads = fit.heads;
  out.m = m;
  out.d = d;
  out.w.resize(static_cast<size_t>(fit.heads * m * d));
  out.bias.resize(static_cast<size_t>(fit.heads * m));
  out.log_const.resize(static_cast<size_t>(fit.heads));
  std::vector<double> root(static_cast<size_t>(d)), u(static_cast<size_t>(m * d)),
      rotated(static_cast<size_t>(m * d));
  for (int64_t g = 0; g < fit.heads; ++g) {
    const double* a = fit.a.data() + g * d;
    const double* q = fit.basis.data() + g * d * d;
    double log_const = feature_log_constant(Kernel::favorpp, m);
    const bool identity = is_identity(q, d);  // FAVOR++: Q = I, no rotation
    for (int64_t l = 0; l < d; ++l) {
      root[l] = std::sqrt(1.0 - 4.0 * a[l]);
      log_const += 0.25 * std::log1p(-4.0 * a[l]);
    }
    out.log_const[g] = log_const;
    // U = W diag(sqrt(1 - 4 A)) and the biases, then W_eff = U Q^T (one GEMM).
    for (int64_t f = 0; f < m; ++f) {
      double bias = 0.0;
      for (int64_t l = 0; l < d; ++l) {
        const double wl = w.at(f, l);
        u[f * d + l] = root[l] * wl;
        bias += a[l] * wl * wl;
      }
      out.bias[g * m + f] = static_cast<float>(bias);
    }
    if (!identity) {
      kernels::backend().dgemm(false, true, m, d, d, 1.0, u.data(), d, q, d, 0.0, rotated.data(),
                               d);
    }
    const std::vector<double>& eff = identity ? u : rotated;
    std::transform(eff.begin(), eff.end(), out.w.begin() + g * m * d,
                   [](double x) { return static_cast<float>(x); });
  }
  return out;
}

std::vector<float> projection_grad(const KernelFit& fit, const Projection& w, const float* dw_heads,
                                   const float* dbias) {
  const int64_t m = w.m(), d = w.d();
  std::vector<double> sum(static_cast<size_t>(m * d), 0.0), g(static_cast<size_t>(m * d)),
      rotated(static_cast<size_t>(m * d)), root(static_cast<size_t>(d));
  for (int64_t h = 0; h < fit.heads; ++h) {
    const double* a = fit.a.data() + h * d;
    const double* q = fit.basis.data() + h * d * d;
    const float* db = dbias + h * m;
    for (int64_t l = 0; l < d; ++l) root[l] = std::sqrt(1.0 - 4.0 * a[l]);
    std::copy_n(dw_heads + h * m * d, m * d, g.begin());
    // dL/dW_h Q_h (one GEMM; FAVOR++'s Q = I needs none), then the columns' sqrt(1 - 4 A_l)
    // and the bias term 2 dL/db_hf A_l w_fl.
    const bool identity = is_identity(q, d);
    if (!identity) {
      kernels::backend().dgemm(false, false, m, d, d, 1.0, g.data(), d, q, d, 0.0, rotated.data(),
                               d);
    }
    const std::vector<double>& gq = identity ? g : rotated;
    for (int64_t f = 0; f < m; ++f)
      for (int64_t l = 0; l < d; ++l)
        sum[f * d + l] += gq[f * d + l] * root[l] + 2.0 * db[f] * a[l] * w.at(f, l);
  }
  std::vector<float> out(sum.size());
  std::transform(sum.begin(), sum.end(), out.begin(),
                 [](double x) { return static_cast<float>(x); });
  return out;
}

AdaptedProjection attention_projection(const TensorView& q, const TensorView& k,
                                       const AttentionOptions& options, double scale,
                                       const Projection& w) {
  if (!data_adapted(options.kernel)) return {};
  const int64_t heads = q.shape[0] * q.shape[1];
  if (options.fit) {
    check_fit(*options.fit, w.d(), heads, "fit");
    return adapt_projection(*options.fit, w);
  }
  if (options.causal) {
    throw Error("fit: causal " + to_string(options.kernel) +
                " attention needs AttentionOptions::fit (from calibration data with "
                "fit_kernel, or KernelFit::constant): a fit to the sequence itself would let "
                "every position see statistics of future tokens");
  }
  KernelFit fit = fit_kernel(options.kernel, q, k, scale, options.key_mask);
  AdaptedProjection out = adapt_projection(fit, w);
  out.fitted = std::move(fit);
  return out;
}

}  // namespace detail
}  // namespace favor
