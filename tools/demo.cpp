// favor demo: FAVOR+ against exact attention on an embedded synthetic workload.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "blas_yardstick.hpp"
#include "cli_common.hpp"
#include "commands.hpp"
#include "workload.hpp"

namespace favor::cli {
namespace {

// The workload: B = 1, H = 4 heads, D = Dv = 64, m = 256 orthogonal features. q and k
// rows have random directions and norm D^(1/4), so the normalised x = q D^(-1/4) has
// |x| = 1 and logits q.k/sqrt(D) lie in [-1, 1]; v is standard Gaussian. Fixed seeds.
// (The positive estimator's relative variance grows like exp(|x + y|^2) / m: at
// |x| = |y| = 2.8, i.e. N(0,1) entries, its output error exceeds 100%. See docs/math.md.)
constexpr int64_t kHeads = 4, kDim = 64;
constexpr int kRepeats = 3;

void run(bool json, const std::vector<int64_t>& lengths, double norm, int64_t features) {
  const Projection w =
      Projection::draw(features, kDim, {ProjectionKind::orthogonal, NormMode::chi, 0});
  nlohmann::json records = nlohmann::json::array();
  if (!json) {
    fmt::print(
        "favor demo: FAVOR+ (positive features, m = {} orthogonal) vs exact softmax attention\n",
        features);
    fmt::print(
        "workload: B = 1, H = {}, D = Dv = {}; q, k random directions with |q| = |k| = {:.3g}; v ~ "
        "N(0, 1)\n",
        kHeads, kDim, norm);
    fmt::print("{}\n", build_info());
    // The machine's yardstick, so that figures from different machines compare: favor's rows
    // run at some fraction of it (docs/performance.md).
    const int64_t n = 2048;
    std::vector<float> a(n * n, 1.0f), b(n * n, 0.5f), c(n * n);
    const double t = [&] {
      const bench::BlasThreads lend(num_threads());
      return median_seconds([&] { bench::sgemm_square(n, a.data(), b.data(), c.data()); }, 5);
    }();
    fmt::print("sgemm {}^3 through favor's BLAS on {} threads: {:.1f} GFLOP/s\n", n, num_threads(),
               2.0 * double(n) * double(n) * double(n) / t / 1e9);
    fmt::print("{:>6} {:>8} {:>12} {:>12} {:>9} {:>14}\n", "N", "mode", "favor [ms]", "exact [ms]",
               "speedup", "rel. error");
  }
  for (int64_t n : lengths) {
    const Tensor q = gaussian_rows({1, kHeads, n, kDim}, 100 + n, norm),
                 k = gaussian_rows({1, kHeads, n, kDim}, 200 + n, norm),
                 v = gaussian_rows({1, kHeads, n, kDim}, 300 + n);
    for (bool causal : {false, true}) {
      AttentionOptions fo;
      fo.causal = causal;
      ExactOptions eo;
      eo.causal = causal;
      Tensor approx, exact;
      const double tf = median_seconds([&] { approx = favor_attention(q, k, v, w, fo); }, kRepeats);
      const double te = median_seconds([&] { exact = exact_attention(q, k, v, eo); }, kRepeats);
      const double err = relative_frobenius_error(approx, exact);
      if (json) {
        records.push_back({{"n", n},
                           {"causal", causal},
                           {"bh", kHeads},
                           {"d", kDim},
                           {"m", features},
                           {"favor_seconds", tf},
                           {"exact_seconds", te},
                           {"speedup", te / tf},
                           {"relative_error", err},
                           {"qk_norm", norm},
                           {"threads", num_threads()}});
      } else {
        fmt::print("{:>6} {:>8} {:>12.3f} {:>12.3f} {:>8.2f}x {:>14.4f}\n", n,
                   causal ? "causal" : "bidir", 1e3 * tf, 1e3 * te, te / tf, err);
      }
    }
  }
  if (json) fmt::print("{}\n", records.dump(2));
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  auto lengths =
      std::make_shared<std::vector<int64_t>>(std::vector<int64_t>{512, 1024, 2048, 4096});
  auto norm = std::make_shared<double>(std::pow(double(kDim), 0.25));
  auto features = std::make_shared<int64_t>(256);
  CLI::App* cmd = app.add_subcommand(
      "demo", "FAVOR+ vs exact attention on a built-in workload: time and error per length");
  cmd->add_flag("--json", *json, "print the rows as a JSON array");
  cmd->add_option("--lengths", *lengths, "sequence lengths to run")->capture_default_str();
  cmd->add_option("--qk-norm", *norm, "row norm of q and k (default D^(1/4): |q.k|/sqrt(D) <= 1)")
      ->capture_default_str();
  cmd->add_option("--features", *features, "random projections m")->capture_default_str();
  cmd->callback([json, lengths, norm, features] {
    if (*features < 1) throw Error("--features: " + std::to_string(*features) + " must be >= 1");
    if (!(*norm > 0.0 && std::isfinite(*norm)))
      throw Error("--qk-norm: " + std::to_string(*norm) + " must be finite and > 0");
    for (int64_t n : *lengths) {
      if (n < 1) throw Error("--lengths: " + std::to_string(n) + " must be >= 1");
    }
    run(*json, *lengths, *norm, *features);
  });
}

}  // namespace favor::cli
