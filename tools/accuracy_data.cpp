// favor accuracy: option checks and the data settings (synthetic grid or .npy files).
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "accuracy_sweep.hpp"
#include "cli_common.hpp"
#include "workload.hpp"

namespace favor::cli {
namespace {

// SplitMix64: the data come from the library's normal stream (an iid projection draw) at
// seeds derived from --data-seed, so that no data row ever equals a projection row drawn
// with a small projection seed 0..S-1.
uint64_t derived_seed(uint64_t seed, uint64_t role) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (role + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

template <class T, class Key>
void check_list(const std::vector<T>& values, const std::string& option, Key&& key) {
  if (values.empty()) throw Error(option + ": the list is empty; give at least one value");
  std::set<decltype(key(values.front()))> seen;
  for (const T& v : values) {
    if (!seen.insert(key(v)).second)
      throw Error(option + ": " + fmt::format("{}", v) + " is listed twice");
  }
}

void check_args(const AccuracyArgs& a) {
  check_list(a.estimators, "--estimators",
             [](const std::string& s) { return parse_kernel(s, "--estimators"); });
  check_list(a.projections, "--projections",
             [](const std::string& s) { return parse_projection_kind(s, "--projections"); });
  check_list(a.features, "--features", [](int64_t m) {
    if (m < 1) throw Error("--features: " + std::to_string(m) + " must be >= 1");
    return m;
  });
  if (a.seeds < 1) throw Error("--seeds: " + std::to_string(a.seeds) + " must be >= 1");
  if (a.kernel_pairs < 1)
    throw Error("--kernel-pairs: " + std::to_string(a.kernel_pairs) + " must be >= 1");
  if (a.scale && !(std::isfinite(*a.scale) && *a.scale > 0.0))
    throw Error("--scale: " + fmt::format("{}", *a.scale) + " must be finite and > 0");
  check_list(a.sections, "--sections", [](const std::string& s) {
    if (s != "favor" && s != "vq" && s != "maps")
      throw Error("--sections: '" + s + "' is not a section; use favor, vq and/or maps");
    return s;
  });
  check_list(a.maps_features, "--maps-features", [](int64_t f) {
    if (f < 2) throw Error("--maps-features: F = " + std::to_string(f) + " must be >= 2");
    return f;
  });
  if (a.vq_options_given && !a.has("vq"))
    throw Error("--vq-codes, --vq-tau-rel, --vq-iterations: only with --sections vq");
  check_list(a.vq_codes, "--vq-codes", [](int64_t c) {
    if (c < 1) throw Error("--vq-codes: " + std::to_string(c) + " must be >= 1");
    return c;
  });
  check_list(a.vq_tau_rel, "--vq-tau-rel", [](double t) {
    if (!(std::isfinite(t) && t >= 0.0))
      throw Error("--vq-tau-rel: " + fmt::format("{}", t) + " must be finite and >= 0");
    return t;
  });
  if (a.vq_iterations < 0)
    throw Error("--vq-iterations: " + std::to_string(a.vq_iterations) + " must be >= 0");
  if (!a.q.empty() || !a.k.empty()) {
    if (a.q.empty() || a.k.empty()) throw Error("--q, --k: give both or neither");
    return;
  }
  if (!a.v.empty()) throw Error("--v: only with --q and --k");
  if (a.n < 1) throw Error("--n: " + std::to_string(a.n) + " must be >= 1");
  if (a.d < 1) throw Error("--d: " + std::to_string(a.d) + " must be >= 1");
  if (a.dv < 1) throw Error("--dv: " + std::to_string(a.dv) + " must be >= 1");
  if (!a.qk_norms.empty()) {
    check_list(a.qk_norms, "--qk-norm", [](double r) {
      if (!(std::isfinite(r) && r > 0.0))
        throw Error("--qk-norm: " + fmt::format("{}", r) + " must be finite and > 0");
      return r;
    });
  }
  check_list(a.qk_cos, "--qk-cos", [](double c) {
    if (!(c >= -1.0 && c <= 1.0))
      throw Error("--qk-cos: " + fmt::format("{}", c) + " must lie in [-1, 1]");
    return c;
  });
}

// Rows r * normalise(sign sqrt(|c|) u + sqrt(1 - |c|) e_i) for unit Gaussian directions e_i.
Tensor mixed_rows(const Tensor& dirs, const Tensor& u, double c, double sign, double r) {
  Tensor t(dirs.shape());
  const int64_t d = dirs.shape()[3], rows = dirs.numel() / d;
  const double a = sign * std::sqrt(std::abs(c)), b = std::sqrt(1.0 - std::abs(c));
  std::vector<double> row(static_cast<size_t>(d));
  for (int64_t i = 0; i < rows; ++i) {
    double n2 = 0.0;
    for (int64_t x = 0; x < d; ++x) {
      row[x] = a * u.data()[x] + b * dirs.data()[i * d + x];
      n2 += row[x] * row[x];
    }
    const double f = n2 > 0.0 ? r / std::sqrt(n2) : 0.0;
    for (int64_t x = 0; x < d; ++x) t.data()[i * d + x] = static_cast<float>(row[x] * f);
  }
  return t;
}

// Norms and angles of a setting, in the normalised x = q sqrt(scale), y = k sqrt(scale).
void describe(DataSetting& s, double scale) {
  const auto& qs = s.q.shape();
  const auto& ks = s.k.shape();
  const int64_t d = qs[3], heads = qs[0] * qs[1];
  double xnorm = 0.0, ynorm = 0.0, cos = 0.0;
  std::vector<double> mq(static_cast<size_t>(d)), mk(static_cast<size_t>(d));
  for (int64_t h = 0; h < heads; ++h) {
    std::fill(mq.begin(), mq.end(), 0.0);
    std::fill(mk.begin(), mk.end(), 0.0);
    const auto accumulate = [d](const float* rows, int64_t n, std::vector<double>& mean) {
      double norms = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        double n2 = 0.0;
        for (int64_t x = 0; x < d; ++x) n2 += double(rows[i * d + x]) * rows[i * d + x];
        norms += std::sqrt(n2);
        for (int64_t x = 0; x < d; ++x)
          mean[x] += n2 > 0.0 ? rows[i * d + x] / std::sqrt(n2) / double(n) : 0.0;
      }
      return norms;
    };
    xnorm += accumulate(s.q.data() + h * qs[2] * d, qs[2], mq);
    ynorm += accumulate(s.k.data() + h * ks[2] * d, ks[2], mk);
    for (int64_t x = 0; x < d; ++x) cos += mq[x] * mk[x] / double(heads);
  }
  s.meta["x_norm_mean"] = xnorm * std::sqrt(scale) / double(heads * qs[2]);
  s.meta["y_norm_mean"] = ynorm * std::sqrt(scale) / double(heads * ks[2]);
  s.meta["mean_cos"] = cos;
  s.meta["batch"] = qs[0];
  s.meta["heads"] = qs[1];
  s.meta["n"] = qs[2];
  s.meta["nk"] = ks[2];
  s.meta["d"] = d;
  s.meta["dv"] = s.v.shape()[3];
}

// The library would refuse non-finite inputs too, but only mid-sweep and naming "q".
const Tensor& finite(const Tensor& t, const std::string& option, const std::string& path) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (!std::isfinite(t.data()[i]))
      throw Error(option + ": " + path + ": element " + std::to_string(i) + " (C order) is " +
                  fmt::format("{}", t.data()[i]) + "; values must be finite");
  }
  return t;
}

std::vector<DataSetting> file_settings(const AccuracyArgs& a) {
  DataSetting s;
  s.label = "files";
  const InputTensor q = read_tensor(a.q, "--q"), k = read_tensor(a.k, "--k");
  const Shape4 &qs = q.shape(), &ks = k.shape();
  if (qs[0] != ks[0] || qs[1] != ks[1] || qs[3] != ks[3]) {
    throw Error("--k: " + a.k + " has shape " + shape_string(ks) + ", --q " + shape_string(qs) +
                ": batch, heads and D must match");
  }
  if (a.causal && qs[2] != ks[2]) {
    throw Error("--causal: --q " + a.q + " has " + std::to_string(qs[2]) + " positions, --k " +
                a.k + " " + std::to_string(ks[2]) + "; causal attention needs as many of each");
  }
  s.q = finite(q.copy(), "--q", a.q);
  s.k = finite(k.copy(), "--k", a.k);
  if (!a.v.empty()) {
    s.v = finite(read_tensor(a.v, "--v").copy(), "--v", a.v);
    const Shape4& vs = s.v.shape();
    if (vs[0] != ks[0] || vs[1] != ks[1] || vs[2] != ks[2]) {
      throw Error("--v: " + a.v + " has shape " + shape_string(vs) + ", --k " + shape_string(ks) +
                  ": batch, heads and N must match");
    }
  } else {
    if (a.dv < 1) throw Error("--dv: " + std::to_string(a.dv) + " must be >= 1");
    s.v = gaussian_rows({ks[0], ks[1], ks[2], a.dv}, derived_seed(a.data_seed, 2));
  }
  s.meta = {{"label", s.label}, {"source", "files"}, {"q", a.q}, {"k", a.k}};
  s.meta["v"] = a.v.empty() ? nlohmann::json(nullptr) : nlohmann::json(a.v);
  return {std::move(s)};
}

}  // namespace

std::vector<DataSetting> make_data_settings(const AccuracyArgs& a) {
  check_args(a);
  std::vector<DataSetting> out;
  if (!a.q.empty()) {
    out = file_settings(a);
  } else {
    const Shape4 shape{1, 1, a.n, a.d};
    const Tensor eq = gaussian_rows(shape, derived_seed(a.data_seed, 0), 1.0),
                 ek = gaussian_rows(shape, derived_seed(a.data_seed, 1), 1.0),
                 v = gaussian_rows({1, 1, a.n, a.dv}, derived_seed(a.data_seed, 2)),
                 u = gaussian_rows({1, 1, 1, a.d}, derived_seed(a.data_seed, 3), 1.0);
    const std::vector<double> norms =
        a.qk_norms.empty() ? std::vector<double>{std::pow(double(a.d), 0.25)} : a.qk_norms;
    for (double r : norms) {
      for (double c : a.qk_cos) {
        DataSetting s;
        s.label = fmt::format("synthetic(norm={:.4g},cos={:.4g})", r, c);
        for (const DataSetting& other : out) {
          if (other.label == s.label)
            throw Error("--qk-norm, --qk-cos: two settings print as " + s.label);
        }
        s.q = mixed_rows(eq, u, c, 1.0, r);
        s.k = mixed_rows(ek, u, c, c < 0 ? -1.0 : 1.0, r);
        s.v = v;
        s.meta = {{"label", s.label}, {"source", "synthetic"}, {"qk_norm", r}, {"qk_cos", c}};
        out.push_back(std::move(s));
      }
    }
  }
  const int64_t d = out.front().q.shape()[3];
  const double scale = a.scale.value_or(1.0 / std::sqrt(double(d)));
  for (DataSetting& s : out) describe(s, scale);
  return out;
}

}  // namespace favor::cli
