// favor accuracy: the sweep, with the kernel MSE next to its closed form (math.md s.4).
#include "accuracy_sweep.hpp"

#include <algorithm>
#include <cmath>

namespace favor::cli {
namespace {

// The kernel-MSE pairs: the first P queries x first 64 keys of head (0, 0), as views for
// kernel_mse and as normalised double rows x = q sqrt(scale), y = k sqrt(scale).
struct Pairs {
  TensorView xv, yv;
  int64_t d = 0, nx = 0, ny = 0;
  std::vector<double> x, y;  // nx x d, ny x d
  double mean_sm2 = 0.0;     // mean exp(x.y)^2: relative MSE = MSE / mean_sm2
  double mean_gap2 = 0.0;    // mean (exp(x.y) - exp(-(|x|^2 + |y|^2)/2))^2: orthogonal bound
};

constexpr int64_t kKernelKeys = 64;

Pairs make_pairs(const DataSetting& s, int64_t queries, double scale) {
  Pairs p;
  const int64_t d = p.d = s.q.shape()[3];
  p.nx = std::min(queries, s.q.shape()[2]);
  p.ny = std::min(kKernelKeys, s.k.shape()[2]);
  p.xv = TensorView{s.q.data(), {1, 1, p.nx, d}, contiguous_strides(s.q.shape())};
  p.yv = TensorView{s.k.data(), {1, 1, p.ny, d}, contiguous_strides(s.k.shape())};
  const double r = std::sqrt(scale);
  for (int64_t t = 0; t < p.nx * d; ++t) p.x.push_back(r * s.q.data()[t]);
  for (int64_t t = 0; t < p.ny * d; ++t) p.y.push_back(r * s.k.data()[t]);
  const double pairs = double(p.nx * p.ny);
  for (int64_t i = 0; i < p.nx; ++i)
    for (int64_t j = 0; j < p.ny; ++j) {
      double xx = 0.0, yy = 0.0, xy = 0.0;
      for (int64_t t = 0; t < d; ++t) {
        xx += p.x[i * d + t] * p.x[i * d + t];
        yy += p.y[j * d + t] * p.y[j * d + t];
        xy += p.x[i * d + t] * p.y[j * d + t];
      }
      const double gap = std::exp(xy) - std::exp(-0.5 * (xx + yy));
      p.mean_sm2 += std::exp(2.0 * xy) / pairs;
      p.mean_gap2 += gap * gap / pairs;
    }
  return p;
}

// The closed-form iid MSE with one projection (favor::iid_mse, math.md s.4), averaged over
// the pairs: the variance of one term; with m projections the MSE is this / m.
double mean_iid_var1(const Pairs& p, Kernel kernel, const KernelFit* fit) {
  double sum = 0.0;
  for (int64_t i = 0; i < p.nx; ++i)
    for (int64_t j = 0; j < p.ny; ++j)
      sum += iid_mse(kernel, &p.x[i * p.d], &p.y[j * p.d], p.d, 1, fit, 0);
  return sum / double(p.nx * p.ny);
}

// The parameters of head (0, 0) of a fit over every head: the kernel-MSE pairs live there.
KernelFit head0(const KernelFit& f) {
  if (f.heads <= 1) return f;
  KernelFit h;
  h.heads = 1;
  h.d = f.d;
  h.a.assign(f.a.begin(), f.a.begin() + f.d);
  h.basis.assign(f.basis.begin(), f.basis.begin() + f.d * f.d);
  return h;
}

}  // namespace

MeanStd mean_std(const std::vector<double>& v) {
  MeanStd r;
  for (double x : v) r.mean += x / double(v.size());
  if (v.size() < 2) return r;
  double ss = 0.0;
  for (double x : v) ss += (x - r.mean) * (x - r.mean);
  r.std = std::sqrt(ss / double(v.size() - 1));
  return r;
}

nlohmann::json run_accuracy_sweep(const AccuracyArgs& a, const std::vector<DataSetting>& data,
                                  const Progress& progress, const RecordSink& sink) {
  const int64_t total = static_cast<int64_t>(data.size() * a.estimators.size() *
                                             a.projections.size() * a.features.size());
  int64_t done = 0;
  nlohmann::json records = nlohmann::json::array();
  for (const DataSetting& s : data) {
    const int64_t d = s.q.shape()[3];
    const double scale = a.scale.value_or(1.0 / std::sqrt(double(d)));
    ExactOptions eo;
    eo.causal = a.causal;
    eo.scale = scale;
    eo.accumulation = Accumulation::f64;
    const Tensor exact = exact_attention(s.q, s.k, s.v, eo);
    const Pairs pairs = make_pairs(s, a.kernel_pairs, scale);
    const double positive_var1 = mean_iid_var1(pairs, Kernel::positive, nullptr);
    for (const std::string& estimator : a.estimators) {
      const Kernel kernel = parse_kernel(estimator, "--estimators");
      AttentionOptions ao;
      ao.kernel = kernel;
      ao.causal = a.causal;
      ao.scale = scale;
      FeatureOptions fo;
      fo.kernel = kernel;
      fo.scale = scale;
      if (data_adapted(kernel)) {
        // The fit bidirectional attention would make itself, computed once for all seeds;
        // causal attention (which does not fit itself) is given the same one.
        ao.fit = fit_kernel(kernel, s.q, s.k, scale);
        fo.fit = head0(*ao.fit);
      }
      const double var1 = mean_iid_var1(pairs, kernel, fo.fit ? &*fo.fit : nullptr);
      for (const std::string& projection : a.projections) {
        const ProjectionKind kind = parse_projection_kind(projection, "--projections");
        for (int64_t m : a.features) {
          if (progress) progress(++done, total, estimator, projection, m);
          std::vector<double> errors, mses;
          int64_t zero_rows = 0;
          for (int64_t seed = 0; seed < a.seeds; ++seed) {
            const Projection w =
                Projection::draw(m, d, {kind, NormMode::chi, static_cast<uint64_t>(seed)});
            AttentionStats stats;
            const Tensor approx = favor_attention(s.q, s.k, s.v, w, ao, &stats);
            zero_rows += stats.zero_rows;
            errors.push_back(relative_frobenius_error(approx, exact));
            mses.push_back(kernel_mse(pairs.xv, pairs.yv, w, fo));
          }
          const MeanStd err = mean_std(errors), mse = mean_std(mses);
          nlohmann::json r = {{"data", s.label},
                              {"estimator", to_string(kernel)},
                              {"projection", to_string(kind)},
                              {"m", m},
                              {"features", feature_count(kernel, m)},
                              {"seeds", a.seeds},
                              {"attention_rel_error", err.mean},
                              {"attention_rel_error_std", err.std},
                              {"kernel_mse", mse.mean},
                              {"kernel_mse_std", mse.std},
                              {"kernel_rel_mse", mse.mean / pairs.mean_sm2}};
          if (kind == ProjectionKind::iid) {
            r["kernel_mse_closed_form"] = var1 / double(m);
            r["kernel_rel_mse_closed_form"] = var1 / double(m) / pairs.mean_sm2;
          }
          if (kind == ProjectionKind::orthogonal && kernel == Kernel::positive && m <= d) {
            // math.md s.4: MSE_ort <= MSE_iid - 2(m-1)/(m(d+2)) (SM - exp(-(|x|^2+|y|^2)/2))^2
            const double shrink = 2.0 * double(m - 1) / (double(m) * double(d + 2));
            const double bound = positive_var1 / double(m) - shrink * pairs.mean_gap2;
            r["kernel_mse_upper_bound"] = bound;
            r["kernel_rel_mse_upper_bound"] = bound / pairs.mean_sm2;
          }
          r["zero_rows"] = zero_rows;
          if (sink) sink(r);
          records.push_back(std::move(r));
        }
      }
    }
  }
  return records;
}

}  // namespace favor::cli
