// favor accuracy, maps section: the DiJiang and learned feature maps against the random
// ones at equal feature count F, on held-out positions. Each sequence's first half trains
// the fitted maps (fit_features, one parameter set per head); attention is evaluated on the
// second half, which no fit has seen. Rows:
//   favor+      positive, orthogonal projection (m = F)
//   favor++     FAVOR++, orthogonal, fitted in closed form to the evaluated q, k (m = F)
//   favor#      FAVOR#, likewise (m = F)
//   dct         positive, DiJiang's DCT projection (chi norms), no training (m = F)
//   wpff        dct with feature weights lambda fitted (DiJiang's WPFF; m = F)
//   positive-fit  positive, orthogonal start, W, b and lambda fitted (m = F)
//   hedgehog    [exp(W x + b), exp(-W x - b)], orthogonal start, W and b fitted (m = F / 2)
// With --causal every attention call is causal: the exact reference, the fits' targets and
// losses (FitOptions::causal) and the maps.
#include <chrono>
#include <cmath>

#include "accuracy_sweep.hpp"
#include "favor/fit.hpp"

namespace favor::cli {
namespace {

// Positions [from, from + count) of a [B, H, N, X] tensor, as a view.
TensorView positions(const Tensor& t, int64_t from, int64_t count) {
  const TensorView all = t.view();
  return TensorView{all.data + from * all.strides[2],
                    {all.shape[0], all.shape[1], count, all.shape[3]},
                    all.strides};
}

struct MapMethod {
  std::string name;
  Kernel kernel;
  ProjectionKind projection;
  bool fitted;
  bool weights, bias, lambda;  // what the fit learns
};

const std::vector<MapMethod>& methods() {
  static const std::vector<MapMethod> all{
      {"favor+", Kernel::positive, ProjectionKind::orthogonal, false, false, false, false},
      {"favor++", Kernel::favorpp, ProjectionKind::orthogonal, false, false, false, false},
      {"favor#", Kernel::favorsharp, ProjectionKind::orthogonal, false, false, false, false},
      {"dct", Kernel::positive, ProjectionKind::dct, false, false, false, false},
      {"wpff", Kernel::positive, ProjectionKind::dct, true, false, false, true},
      {"positive-fit", Kernel::positive, ProjectionKind::orthogonal, true, true, true, true},
      {"hedgehog", Kernel::hedgehog, ProjectionKind::orthogonal, true, true, true, false},
  };
  return all;
}

}  // namespace

nlohmann::json run_maps_sweep(const AccuracyArgs& a, const std::vector<DataSetting>& data,
                              const MapsProgress& progress, const RecordSink& sink) {
  const int64_t total =
      static_cast<int64_t>(data.size() * a.maps_features.size() * methods().size());
  int64_t done = 0;
  nlohmann::json records = nlohmann::json::array();
  for (const DataSetting& s : data) {
    const int64_t n = s.k.shape()[2], d = s.q.shape()[3], half = n / 2;
    if (half < 1 || s.q.shape()[2] != n) {
      throw Error("maps section: q and k need the same length N >= 2 (fit | evaluate halves)");
    }
    const FitData train{positions(s.q, 0, half), positions(s.k, 0, half), positions(s.v, 0, half),
                        std::nullopt};
    const FitData held{positions(s.q, half, n - half), positions(s.k, half, n - half),
                       positions(s.v, half, n - half), std::nullopt};
    const double scale = a.scale.value_or(1.0 / std::sqrt(double(d)));
    ExactOptions eo;
    eo.causal = a.causal;
    eo.scale = scale;
    eo.accumulation = Accumulation::f64;
    const Tensor exact = exact_attention(held.q, held.k, held.v, eo);
    AttentionOptions ao;
    ao.causal = a.causal;
    // FAVOR++ / FAVOR#: the closed-form fit to the evaluated q, k that bidirectional attention
    // makes itself, given explicitly so that causal attention (which refuses to fit itself)
    // uses the same one.
    const KernelFit fit_pp = fit_kernel(Kernel::favorpp, held.q, held.k, scale),
                    fit_sharp = fit_kernel(Kernel::favorsharp, held.q, held.k, scale);
    for (int64_t F : a.maps_features) {
      for (const MapMethod& method : methods()) {
        if (progress) progress(++done, total, method.name, F);
        const int64_t m = method.kernel == Kernel::hedgehog ? std::max<int64_t>(F / 2, 1) : F;
        std::vector<double> errors, initial, seconds;
        for (int64_t seed = 0; seed < a.seeds; ++seed) {
          FeatureMap map(Projection::draw(
                             m, d, {method.projection, NormMode::chi, static_cast<uint64_t>(seed)}),
                         method.kernel);
          map.scale = scale;
          if (method.kernel == Kernel::favorpp) map.fit = fit_pp;
          if (method.kernel == Kernel::favorsharp) map.fit = fit_sharp;
          if (method.fitted) {
            FitOptions fo;
            fo.steps = static_cast<int>(a.maps_steps);
            fo.learning_rate = a.maps_lr;
            fo.learn_weights = method.weights;
            fo.learn_bias = method.bias;
            fo.learn_lambda = method.lambda;
            fo.eval_every = 0;
            fo.causal = a.causal;
            const auto t0 = std::chrono::steady_clock::now();
            FitResult fit = fit_features(train, held, map, fo);
            seconds.push_back(
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
            initial.push_back(fit.history.front().heldout_error);
            map = std::move(fit.map);
          }
          const Tensor approx = favor_attention(held.q, held.k, held.v, map, ao);
          errors.push_back(relative_frobenius_error(approx, exact));
        }
        const MeanStd err = mean_std(errors);
        nlohmann::json r = {{"data", s.label},
                            {"method", method.name},
                            {"kernel", to_string(method.kernel)},
                            {"projection", to_string(method.projection)},
                            {"features", F},
                            {"m", m},
                            {"fitted", method.fitted},
                            {"seeds", a.seeds},
                            {"train_positions", half},
                            {"evaluated_positions", n - half},
                            {"attention_rel_error", err.mean},
                            {"attention_rel_error_std", err.std}};
        if (method.fitted) {
          r["steps"] = a.maps_steps;
          r["learning_rate"] = a.maps_lr;
          r["initial_rel_error"] = mean_std(initial).mean;
          r["fit_seconds"] = mean_std(seconds).mean;
        }
        if (sink) sink(r);
        records.push_back(std::move(r));
      }
    }
  }
  return records;
}

}  // namespace favor::cli
