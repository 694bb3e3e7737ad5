// The codebook-learning facade: validates arguments and calls the backend
// (kernels/codebook_params.hpp) for k-means, the EMA step, the quantisation error and the
// commitment loss.
#include "favor/codebook.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <utility>

#include "core/validate.hpp"
#include "core/vq_validate.hpp"
#include "favor/error.hpp"
#include "kernels/backend.hpp"

namespace favor {
namespace {

void check_keys(const TensorView& keys, const std::optional<KeyMaskView>& mask) {
  detail::check_view(keys, "keys");
  if (mask) {
    if (mask->data == nullptr) throw Error("mask: data pointer is null");
    if (mask->batch != keys.shape[0] || mask->n != keys.shape[2]) {
      throw Error("mask: shape [" + std::to_string(mask->batch) + ',' + std::to_string(mask->n) +
                  "] must be [B, N] = [" + std::to_string(keys.shape[0]) + ',' +
                  std::to_string(keys.shape[2]) + "] of keys " + shape_string(keys.shape));
    }
    if (mask->stride_b < 0 || mask->stride_n < 0) throw Error("mask: strides must be non-negative");
  }
  detail::check_finite(keys, "keys");
}

// Keys against a codebook [1, Hc, c, D]: one group per head, or all heads pooled (Hc == 1).
kernels::CodebookKeys codebook_keys(const TensorView& keys, const TensorView& codebook,
                                    const std::optional<KeyMaskView>& mask,
                                    const std::string& name) {
  check_keys(keys, mask);
  detail::check_codebook(codebook, keys.shape[1], keys.shape[3], name);
  return {keys, mask, codebook.shape[1] == 1};
}

// Unmasked keys per head: every head of a batch row shares the row's mask.
int64_t keys_per_head(const TensorView& keys, const std::optional<KeyMaskView>& mask) {
  if (!mask) return keys.shape[0] * keys.shape[2];
  int64_t kept = 0;
  for (int64_t b = 0; b < keys.shape[0]; ++b)
    for (int64_t n = 0; n < keys.shape[2]; ++n) kept += mask->at(b, n) ? 1 : 0;
  return kept;
}

std::string number(double x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

void check_ema_options(const EMAOptions& o) {
  if (!(o.decay > 0.0 && o.decay < 1.0))
    throw Error("decay: " + number(o.decay) + " must be in (0, 1)");
  if (!(std::isfinite(o.eps) && o.eps > 0.0))
    throw Error("eps: " + number(o.eps) + " must be finite and > 0");
  if (o.dead_after < 0)
    throw Error("dead_after: " + std::to_string(o.dead_after) + " must be >= 0 (0: never)");
}

}  // namespace

Codebook::Codebook(int64_t heads, int64_t codes, int64_t d, std::vector<float> values)
    : heads_(heads), codes_(codes), d_(d), values_(std::move(values)) {
  for (auto [name, extent] : {std::pair{"heads", heads}, {"codes", codes}, {"d", d}}) {
    if (extent < 1)
      throw Error(std::string(name) + ": " + std::to_string(extent) + " must be >= 1");
  }
  if (static_cast<int64_t>(values_.size()) != heads * codes * d) {
    throw Error("values: size " + std::to_string(values_.size()) +
                " must be heads * codes * d = " + std::to_string(heads * codes * d));
  }
  for (size_t i = 0; i < values_.size(); ++i) {
    if (!std::isfinite(values_[i]))
      throw Error("values: element " + std::to_string(i) + " is not finite");
  }
  ema_sum_ = values_;
  ema_count_.assign(static_cast<size_t>(heads * codes), 1.0f);
  unused_.assign(static_cast<size_t>(heads * codes), 0);
}

Codebook Codebook::kmeans(TensorView keys, int64_t codes, const KMeansOptions& options,
                          bool per_head, const std::optional<KeyMaskView>& mask) {
  check_keys(keys, mask);
  if (codes < 1) throw Error("codes: " + std::to_string(codes) + " must be >= 1");
  if (options.iterations < 0) {
    throw Error("iterations: " + std::to_string(options.iterations) + " must be >= 0");
  }
  // Every group has the same keys per head: one head's (per head) or H heads' (pooled).
  const int64_t fewest = keys_per_head(keys, mask) * (per_head ? 1 : keys.shape[1]);
  if (codes > fewest) {
    throw Error("codes: " + std::to_string(codes) + " must be <= the number of unmasked keys " +
                (per_head ? "per head" : "of all heads") + " (" + std::to_string(fewest) + ")");
  }
  const std::unique_ptr<kernels::KMeansRun> km =
      kernels::backend().kmeans({keys, mask, !per_head}, codes);
  km->seed(options.seed);
  double error = km->assign();
  if (options.on_iteration) options.on_iteration(0, error);
  for (int64_t i = 1; i <= options.iterations; ++i) {
    km->update();
    error = km->assign();
    if (options.on_iteration) options.on_iteration(i, error);
  }
  return Codebook(per_head ? keys.shape[1] : 1, codes, keys.shape[3], km->codebook());
}

double Codebook::quantisation_error(TensorView keys, const std::optional<KeyMaskView>& mask) const {
  const kernels::CodebookKeys groups = codebook_keys(keys, view(), mask, "codebook");
  const int64_t total = keys_per_head(keys, mask) * keys.shape[1];
  if (total == 0) return 0.0;  // every key masked: nothing is quantised
  const double sum = kernels::backend().codebook_distance_sum({groups, values_.data(), codes_});
  return sum / static_cast<double>(total);
}

int64_t codebook_ema_update(CodebookState state, TensorView keys, const EMAOptions& options,
                            uint64_t seed, const std::optional<KeyMaskView>& mask) {
  if (state.heads < 1 || state.codes < 1 || state.d < 1) {
    throw Error("state: heads, codes and d (" + std::to_string(state.heads) + ", " +
                std::to_string(state.codes) + ", " + std::to_string(state.d) + ") must be >= 1");
  }
  if (!state.codebook || !state.ema_sum || !state.ema_count || !state.unused)
    throw Error("state: codebook, ema_sum, ema_count and unused must not be null");
  check_ema_options(options);
  const TensorView codebook =
      TensorView::contiguous(state.codebook, {1, state.heads, state.codes, state.d});
  const kernels::CodebookKeys groups = codebook_keys(keys, codebook, mask, "state.codebook");
  const kernels::CodebookEMA p{state.codebook, state.ema_sum,   state.ema_count,    state.unused,
                               state.codes,    state.d,         options.decay,      options.eps,
                               options.dead_after, seed};
  return kernels::backend().codebook_ema(groups, p);
}

int64_t Codebook::ema_update(TensorView keys, const EMAOptions& options,
                             const std::optional<KeyMaskView>& mask) {
  const CodebookState state{
      values_.data(), ema_sum_.data(), ema_count_.data(), unused_.data(), heads_, codes_, d_};
  const int64_t reseeded = codebook_ema_update(state, keys, options, updates_, mask);
  ++updates_;  // after success: a refused call changes nothing
  return reseeded;
}

Commitment commitment_loss(TensorView keys, TensorView codebook, double beta,
                           const std::optional<KeyMaskView>& mask) {
  if (!(std::isfinite(beta) && beta >= 0.0))
    throw Error("beta: " + number(beta) + " must be finite and >= 0");
  const kernels::CodebookKeys groups = codebook_keys(keys, codebook, mask, "codebook");
  const std::vector<float> codes = detail::contiguous_codebook(codebook);
  const int64_t total = keys_per_head(keys, mask) * keys.shape[1];
  Commitment out;
  out.dk = Tensor(keys.shape);
  if (total == 0) return out;  // every key masked: no loss, no gradient
  // dk = 2 beta (k - C_z) / count; the loss from the same differences, in double.
  const float grad = static_cast<float>(2.0 * beta / static_cast<double>(total));
  const double sum = kernels::backend().codebook_commitment({groups, codes.data(),
                                                             codebook.shape[2]},
                                                            grad, out.dk.data());
  out.loss = beta * sum / static_cast<double>(total);
  return out;
}

}  // namespace favor
