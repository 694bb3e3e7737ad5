#pragma once
// favor accuracy: the data settings and the sweep m x estimator x projection x seed against
// exact softmax attention, with the kernel MSE next to its closed form (math.md s.4).
#include <algorithm>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "favor/favor.hpp"

namespace favor::cli {

struct AccuracyArgs {
  bool json = false, progress = false;
  std::string out, plot;
  std::vector<std::string> estimators{"positive", "trig", "hyperbolic", "favorpp", "favorsharp"};
  std::vector<std::string> projections{"iid", "orthogonal", "radial", "qmc", "sorf", "simplex"};
  std::vector<int64_t> features{16, 32, 64, 128, 256, 512, 1024};
  int64_t seeds = 5;
  std::optional<double> scale;
  // Causal attention in every call of the study (exact and approximations): query i sees
  // keys j <= i. Needs as many queries as keys.
  bool causal = false;
  // Synthetic data.
  int64_t n = 512, d = 64, dv = 64;
  std::vector<double> qk_norms;  // empty: D^(1/4), i.e. |x| = |y| = 1 at the default scale
  std::vector<double> qk_cos{0.0};
  uint64_t data_seed = 1234;
  // User data.
  std::string q, k, v;
  int64_t kernel_pairs = 64;
  // Sections: favor (the sweep above) and vq (Transformer-VQ against FAVOR+ at m = c).
  std::vector<std::string> sections{"favor"};
  std::vector<int64_t> vq_codes{16, 64, 256, 1024};
  std::vector<double> vq_tau_rel{0.0, 0.1, 1.0};  // tau in units of the quantisation error
  int64_t vq_iterations = 25;
  // Where the codebook comes from: "heldout" (k-means on the keys of the first half of each
  // sequence; attention evaluated on the second half) or "same" (k-means on the evaluated
  // keys themselves: in-sample, an optimistic bound).
  std::string vq_fit = "heldout";
  bool vq_options_given = false;  // a --vq-* option was on the command line
  // Section maps: DiJiang and learned maps vs the random ones at equal feature count F.
  std::vector<int64_t> maps_features{64, 256};
  int64_t maps_steps = 200;
  double maps_lr = 0.02;
  bool has(const std::string& section) const {
    return std::find(sections.begin(), sections.end(), section) != sections.end();
  }
};

/// One data setting: q, k, v [B, H, N, D] and a JSON description (label, norms, ...).
struct DataSetting {
  std::string label;
  Tensor q, k, v;
  nlohmann::json meta;
};

/// Checks the options (throws favor::Error naming the option) and builds the data settings:
/// the synthetic grid --qk-norm x --qk-cos, or the --q/--k[/--v] files.
std::vector<DataSetting> make_data_settings(const AccuracyArgs& args);

struct MeanStd {
  double mean = 0.0, std = 0.0;
};
/// Mean and sample standard deviation (n - 1 in the denominator; 0 for a single value).
MeanStd mean_std(const std::vector<double>& v);

/// Called before each combination with (index from 1, total, estimator, projection, m).
using Progress =
    std::function<void(int64_t, int64_t, const std::string&, const std::string&, int64_t)>;
/// Called after each combination with its finished record.
using RecordSink = std::function<void(const nlohmann::json&)>;

/// Runs the sweep over every data setting and returns the records (one per data x estimator
/// x projection x m, in that nesting order).
nlohmann::json run_accuracy_sweep(const AccuracyArgs& args, const std::vector<DataSetting>& data,
                                  const Progress& progress, const RecordSink& sink);

/// Called before each VQ codebook size with (index from 1, total, codes).
using VQProgress = std::function<void(int64_t, int64_t, int64_t)>;

/// The vq section (accuracy_vq.cpp): per data setting and codebook size c (--vq-codes,
/// clipped to the keys per head), codebooks learned by k-means on the setting's keys with
/// seeds 0 .. S-1, hard and soft VQ attention (--vq-tau-rel) against exact attention, and
/// FAVOR+ (positive, orthogonal) with m = c projections of the same seeds. One record per
/// data x c x tau.
nlohmann::json run_vq_sweep(const AccuracyArgs& args, const std::vector<DataSetting>& data,
                            const VQProgress& progress, const RecordSink& sink);

/// Called before each method of the maps section with (index from 1, total, method, F).
using MapsProgress = std::function<void(int64_t, int64_t, const std::string&, int64_t)>;

/// The maps section (accuracy_maps.cpp): per data setting and feature count F
/// (--maps-features), favor+, favor++, favor#, dct, wpff (dct + fitted lambda), positive-fit
/// (W, b, lambda fitted) and hedgehog (fitted, m = F / 2) against exact attention on the
/// second half of each sequence; the fitted maps train on the first half (fit_features,
/// --maps-steps, --maps-lr). Seeds 0 .. S-1 draw the projections (and start the fits). One
/// record per data x F x method.
nlohmann::json run_maps_sweep(const AccuracyArgs& args, const std::vector<DataSetting>& data,
                              const MapsProgress& progress, const RecordSink& sink);

}  // namespace favor::cli
