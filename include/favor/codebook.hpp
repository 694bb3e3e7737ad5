#pragma once
/// \file codebook.hpp
/// Learning Transformer-VQ codebooks: k-means++ and Lloyd iterations from data, EMA updates
/// with dead-code reset for training, the commitment loss (math.md s.6, docs/vq.md).
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "favor/tensor.hpp"

namespace favor {

struct KMeansOptions {
  /// Lloyd iterations after the k-means++ seeding.
  int64_t iterations = 25;
  /// Seeds the k-means++ draws; the codebook depends only on (keys, codes, options).
  uint64_t seed = 0;
  /// Called after the seeding (iteration 0) and after each Lloyd iteration with the mean
  /// squared quantisation error |k - C_z|^2 over the (unmasked) keys, averaged over heads.
  std::function<void(int64_t iteration, double error)> on_iteration;
};

struct EMAOptions {
  /// sum_s <- g sum_s + (1 - g) sum_{z_j = s} k_j, count_s <- g count_s + (1 - g) n_s.
  double decay = 0.99;
  /// A code no key was assigned to for this many consecutive updates is re-seeded from a
  /// key of the current update (a recent key). 0: never.
  int64_t dead_after = 50;
  /// C_s = sum_s / max(count_s, eps).
  double eps = 1e-5;
};

/// The caller-owned state of EMA training, per codebook head: the codebook [Hc, c, D], the
/// EMA sums [Hc, c, D] and counts [Hc, c], and the number of consecutive updates each code
/// went unused [Hc, c]. All C-contiguous. Bindings keep these in their own buffers.
struct CodebookState {
  float* codebook;
  float* ema_sum;
  float* ema_count;
  int64_t* unused;
  int64_t heads, codes, d;
};

/// One EMA step on keys [B, H, N, D] (H == heads, or heads == 1: all heads pooled); masked
/// keys are skipped. Codes unused for options.dead_after updates are re-seeded from keys of
/// this call, drawn with `seed` (their sums and counts restart). Returns the number of codes
/// re-seeded.
int64_t codebook_ema_update(CodebookState state, TensorView keys, const EMAOptions& options = {},
                            uint64_t seed = 0, const std::optional<KeyMaskView>& mask = {});

/// beta * mean_j |k_j - sg(C_{z_j})|^2 over the (unmasked) keys, and its gradient with
/// respect to k (dk: shape of k; zero for masked keys).
struct Commitment {
  double loss = 0.0;
  Tensor dk;
};
Commitment commitment_loss(TensorView keys, TensorView codebook, double beta = 0.25,
                           const std::optional<KeyMaskView>& mask = {});

/// A codebook that owns its values and EMA state.
class Codebook {
 public:
  /// heads x codes x d values (C order); EMA state starts at count 1, sum = value.
  Codebook(int64_t heads, int64_t codes, int64_t d, std::vector<float> values);

  /// k-means++ seeding, then Lloyd iterations, on keys [B, H, N, D]: one codebook per head
  /// (heads == H) or one pooled over all heads (per_head = false). Refuses codes larger than
  /// the number of (unmasked) keys per codebook.
  static Codebook kmeans(TensorView keys, int64_t codes, const KMeansOptions& options = {},
                         bool per_head = true, const std::optional<KeyMaskView>& mask = {});

  int64_t heads() const { return heads_; }
  int64_t codes() const { return codes_; }
  int64_t d() const { return d_; }
  const std::vector<float>& values() const { return values_; }
  /// [1, heads, codes, d], for vq_attention.
  TensorView view() const { return TensorView::contiguous(values_.data(), {1, heads_, codes_, d_}); }

  /// Mean |k - C_z|^2 over the (unmasked) keys.
  double quantisation_error(TensorView keys, const std::optional<KeyMaskView>& mask = {}) const;
  /// An EMA step (codebook_ema_update on this codebook's state); seeds advance per call.
  int64_t ema_update(TensorView keys, const EMAOptions& options = {},
                     const std::optional<KeyMaskView>& mask = {});
  /// Consecutive updates each code went unused, [heads][codes].
  const std::vector<int64_t>& unused() const { return unused_; }

 private:
  int64_t heads_, codes_, d_;
  std::vector<float> values_, ema_sum_, ema_count_;
  std::vector<int64_t> unused_;
  uint64_t updates_ = 0;
};

}  // namespace favor
