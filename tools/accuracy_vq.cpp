// favor accuracy, vq section: Transformer-VQ attention against exact attention as the
// codebook grows, hard and soft, next to FAVOR+ with as many features as codes (the same
// state size: c codes x (Dv + 1) sums vs m features x (Dv + 1)). Attention is evaluated on
// the second half of each sequence; the codebook is fitted on the first half (held out) or,
// with --vq-fit same, on the evaluated keys themselves. With --causal, exact, VQ and FAVOR+
// attention are all causal.
#include <cmath>

#include "accuracy_sweep.hpp"

namespace favor::cli {
namespace {

// --vq-codes clipped to the keys each per-head codebook learns from, without repeats.
std::vector<int64_t> clipped_codes(const std::vector<int64_t>& requested, int64_t keys) {
  std::vector<int64_t> out;
  for (int64_t c : requested) {
    const int64_t clipped = std::min(c, keys);
    if (std::find(out.begin(), out.end(), clipped) == out.end()) out.push_back(clipped);
  }
  return out;
}

// Positions [from, N) of a [B, H, N, X] tensor, as a view.
TensorView tail(const Tensor& t, int64_t from) {
  const TensorView all = t.view();
  return TensorView{all.data + from * all.strides[2],
                    {all.shape[0], all.shape[1], all.shape[2] - from, all.shape[3]},
                    all.strides};
}

}  // namespace

nlohmann::json run_vq_sweep(const AccuracyArgs& a, const std::vector<DataSetting>& data,
                            const VQProgress& progress, const RecordSink& sink) {
  std::vector<std::vector<int64_t>> codes;
  int64_t total = 0, done = 0;
  for (const DataSetting& s : data) {
    const Shape4& ks = s.k.shape();
    if (ks[2] < 2) throw Error("vq section: the keys need at least 2 positions (fit | evaluate)");
    codes.push_back(clipped_codes(a.vq_codes, ks[0] * (ks[2] / 2)));
    total += static_cast<int64_t>(codes.back().size());
  }
  nlohmann::json records = nlohmann::json::array();
  for (size_t i = 0; i < data.size(); ++i) {
    const DataSetting& s = data[i];
    const int64_t d = s.q.shape()[3], half = s.k.shape()[2] / 2;
    // the second half of the queries and of the keys, from the same position when Nq == Nk
    // (an odd N included), as causal attention needs
    const TensorView q = tail(s.q, s.q.shape()[2] / 2), k = tail(s.k, half), v = tail(s.v, half);
    const TensorView fit_keys = a.vq_fit == "same"
                                    ? k
                                    : TensorView{s.k.data(),
                                                 {s.k.shape()[0], s.k.shape()[1], half, d},
                                                 contiguous_strides(s.k.shape())};
    const double scale = a.scale.value_or(1.0 / std::sqrt(double(d)));
    ExactOptions eo;
    eo.causal = a.causal;
    eo.scale = scale;
    eo.accumulation = Accumulation::f64;
    const Tensor exact = exact_attention(q, k, v, eo);
    AttentionOptions fo;
    fo.causal = a.causal;
    fo.scale = scale;
    for (int64_t c : codes[i]) {
      if (progress) progress(++done, total, c);
      const size_t taus = a.vq_tau_rel.size();
      std::vector<std::vector<double>> errors(taus), tau_abs(taus);
      std::vector<int64_t> zero_rows(taus, 0);
      std::vector<double> favor_errors, quantisation;
      for (int64_t seed = 0; seed < a.seeds; ++seed) {
        KMeansOptions ko;
        ko.iterations = a.vq_iterations;
        ko.seed = static_cast<uint64_t>(seed);
        const Codebook codebook = Codebook::kmeans(fit_keys, c, ko);
        // Soft VQ's temperature in units of this codebook's mean squared quantisation
        // error on the evaluated keys: tau_rel = 1 spreads a key over the codes about as far
        // away as its nearest.
        const double qerr = codebook.quantisation_error(k);
        quantisation.push_back(qerr);
        for (size_t t = 0; t < taus; ++t) {
          VQOptions o;
          o.causal = a.causal;
          o.scale = scale;
          o.tau = a.vq_tau_rel[t] * qerr;
          VQStats stats;
          const Tensor approx = vq_attention(q, k, v, codebook.view(), o, &stats);
          errors[t].push_back(relative_frobenius_error(approx, exact));
          tau_abs[t].push_back(o.tau);
          zero_rows[t] += stats.zero_rows;
        }
        const Projection w = Projection::draw(
            c, d, {ProjectionKind::orthogonal, NormMode::chi, static_cast<uint64_t>(seed)});
        favor_errors.push_back(relative_frobenius_error(favor_attention(q, k, v, w, fo), exact));
      }
      const MeanStd favor = mean_std(favor_errors), q = mean_std(quantisation);
      for (size_t t = 0; t < taus; ++t) {
        const MeanStd err = mean_std(errors[t]);
        nlohmann::json r = {{"data", s.label},
                            {"codes", c},
                            {"fit", a.vq_fit},
                            {"evaluated_positions", k.shape[2]},
                            {"seeds", a.seeds},
                            {"soft", a.vq_tau_rel[t] > 0.0},
                            {"tau_rel", a.vq_tau_rel[t]},
                            {"tau", mean_std(tau_abs[t]).mean},
                            {"attention_rel_error", err.mean},
                            {"attention_rel_error_std", err.std},
                            {"quantisation_error", q.mean},
                            {"quantisation_error_std", q.std},
                            {"favor_m", c},
                            {"favor_rel_error", favor.mean},
                            {"favor_rel_error_std", favor.std},
                            {"zero_rows", zero_rows[t]}};
        if (sink) sink(r);
        records.push_back(std::move(r));
      }
    }
  }
  return records;
}

}  // namespace favor::cli
