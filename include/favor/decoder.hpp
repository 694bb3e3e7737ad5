#pragma once
/// \file decoder.hpp
/// Streaming (autoregressive) FAVOR+ decoding with an O(m Dv) state per (batch, head).
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "favor/decoder_state.hpp"
#include "favor/feature_map.hpp"
#include "favor/features.hpp"
#include "favor/projection.hpp"
#include "favor/tensor.hpp"

namespace favor {
namespace detail {
struct ResolvedMap;
}

struct DecoderOptions {
  Kernel kernel = Kernel::positive;
  std::optional<double> scale;  ///< default 1/sqrt(D), D = projection.d()
  /// FAVOR++ / FAVOR# parameters, required for those kernels (a fixed or calibrated fit:
  /// the decoder never sees future tokens). heads must be 1, heads (one per head: select
  /// follows any reorder, a beam search) or batch * heads.
  std::optional<KernelFit> fit;
  /// Decay gamma in (0, 1] per head (1 or H values), as AttentionOptions::decay: the state
  /// is multiplied by gamma at every appended token. Empty: none.
  std::vector<double> decay;
};

/// Holds, per (batch, head), S = sum phi(k) v^T (F x Dv), s = sum phi(k) (F), and the
/// running key stabiliser. append and query cost O(F (D + Dv)) per token and head,
/// whatever the position. query after append of tokens 0..i equals row i of causal
/// favor_attention. Not thread-safe: one decoder per thread.
class Decoder {
 public:
  Decoder(int64_t batch, int64_t heads, int64_t dv, Projection w,
          const DecoderOptions& options = {});
  /// With any feature map; options.kernel, .scale and .fit must keep their defaults (the
  /// map carries them), options gives the decay.
  Decoder(int64_t batch, int64_t heads, int64_t dv, FeatureMap map,
          const DecoderOptions& options = {});

  /// Appends T tokens: k [B, H, T, D], v [B, H, T, Dv]. With key_mask [B, T] (nonzero =
  /// the token takes part) a masked token adds no key to row b. With decay, row b's clock
  /// (row_positions) counts every token from the row's first kept one on, masked ones too,
  /// so a key decays by the distance i - j as in causal favor_attention with that mask;
  /// masked tokens before the first kept one (left padding) do not count. A masked batch
  /// thus equals causal favor_attention with its key mask, and a left-padded one (or any,
  /// without decay) equals appending each row's kept tokens alone. position() counts every
  /// token.
  void append(TensorView k, TensorView v, const std::optional<KeyMaskView>& key_mask = {});
  /// Attends each of T queries q [B, H, T, D] to the current state; out [B, H, T, Dv].
  /// A head with no appended token yields zeros.
  void query(TensorView q, MutableTensorView out) const;
  Tensor query(TensorView q) const;

  /// One decode step of every row in one fused pass: append(k, v, key_mask) then query(q),
  /// q, k [B, H, 1, D], v [B, H, 1, Dv], key_mask [B, 1]; out [B, H, 1, Dv]. Each row keeps
  /// its own position and mask. Equal to append then query up to the rounding of the
  /// projections (one GEMM for the step's B*H keys and queries instead of a matvec per row);
  /// every operation after them is the same, in the same order. The out overload allocates
  /// nothing once the decoder's step workspace has grown to the batch.
  void step(TensorView q, TensorView k, TensorView v, MutableTensorView out,
            const std::optional<KeyMaskView>& key_mask = {});
  Tensor step(TensorView q, TensorView k, TensorView v,
              const std::optional<KeyMaskView>& key_mask = {});
  /// Prefill of a prompt of T tokens: q, k [B, H, T, D], v [B, H, T, Dv], key_mask [B, T];
  /// out [B, H, T, Dv]. out is causal attention over the prompt from the current state
  /// (from an empty decoder: causal favor_attention with the key mask, bit for bit the
  /// same kernel), and the decoder is left as append(k, v, key_mask) leaves it (equal up to
  /// float rounding: the chunked sweep sums in another order), the key features computed
  /// once (masks and decay included: the clocks are the kernel's positions up to a constant
  /// per row).
  void prefill(TensorView q, TensorView k, TensorView v, MutableTensorView out,
               const std::optional<KeyMaskView>& key_mask = {});
  Tensor prefill(TensorView q, TensorView k, TensorView v,
                 const std::optional<KeyMaskView>& key_mask = {});

  /// The functional forms: the same calls on a state held elsewhere (decoder_state.hpp,
  /// DecoderStateView, of this decoder's extents), read and written in place; this decoder
  /// then lends only its map and workspace, and its own state is neither read nor allocated.
  /// Bit for bit the calls above when the view holds the same values.
  void append(DecoderStateView state, TensorView k, TensorView v,
              const std::optional<KeyMaskView>& key_mask = {});
  void query(const float* sums, TensorView q, MutableTensorView out) const;
  void step(DecoderStateView state, TensorView q, TensorView k, TensorView v, MutableTensorView out,
            const std::optional<KeyMaskView>& key_mask = {});
  void prefill(DecoderStateView state, TensorView q, TensorView k, TensorView v,
               MutableTensorView out, const std::optional<KeyMaskView>& key_mask = {});

  /// The estimated sums of T queries q [B, H, T, D] against the current state, unnormalised:
  /// rows [B*H][T][dv + 1] ([num | den]) and each row's log scale shift [B*H][T] (the true
  /// sums, every constant kept, are rows * exp(shift), at the decay clock of the last kept
  /// token appended; -inf: an empty head). Hybrid decoding's estimated part (HybridDecoder).
  void query_parts(TensorView q, float* rows, double* shift) const;
  /// Tokens appended so far.
  int64_t position() const { return position_; }
  /// Bytes held by the state (S, s, the stabilisers and the row positions): fixed at
  /// construction (and select), whatever the position.
  int64_t state_bytes() const {
    return batch_ * heads_ * features_ * (dv_ + 1) * int64_t(sizeof(float)) +
           batch_ * heads_ * int64_t(sizeof(double)) + batch_ * int64_t(sizeof(int64_t));
  }
  void reset();

  /// A copy of the state (decoder_state.hpp).
  DecoderState state() const;
  /// Replaces the state by `state`, checked against this decoder's batch, heads, features
  /// and dv (favor::Error naming the field otherwise). Loading the state() of a decoder
  /// built with the same map gives bit-identical outputs from then on.
  void load_state(const DecoderState& state);
  /// Keeps batch rows indices[0], indices[1], ... in that order (rows may repeat or be
  /// dropped): the new batch is indices.size(), as a beam-search cache reorders. Each index
  /// in [0, batch). A map with per-(batch, head) parameters (a fit of batch * heads heads,
  /// batch > 1) cannot be reordered and throws.
  void select(const std::vector<int64_t>& indices);

  int64_t batch() const { return batch_; }
  int64_t heads() const { return heads_; }
  int64_t dv() const { return dv_; }
  /// F: the features per token (the rows of S).
  int64_t features() const { return features_; }
  const Projection& projection() const { return w_; }

 private:
  friend class HybridDecoder;  // its estimated part: this decoder's map over its own view
  /// query_parts over the sums, stabilisers and clocks of `state`.
  void query_parts(const DecoderStateView& state, TensorView q, float* rows, double* shift) const;
  /// The decoder's own state (allocated at its first use: a decoder used only through the
  /// functional calls holds none).
  DecoderStateView own();
  int64_t batch_, heads_, dv_, features_;
  Projection w_;
  std::shared_ptr<const detail::ResolvedMap> map_;  // the resolved feature map
  std::vector<float> wt_;  // [w_sets][d][m]: W^T per parameter set, the per-token projection
  int64_t position_ = 0;
  std::vector<float> S_;          // [B*H][F][Dv]
  std::vector<double> max_;       // running key log-max per (b, h)
  std::vector<int64_t> row_pos_;  // [B]: unmasked tokens per batch row (the decay clock)
  std::vector<float> step_ws_;    // step's workspace (projections, features), grown only
  std::vector<double> step_ws_d_;
};

/// The functional decode step on a state held elsewhere: decoder.step(state, ...), the
/// decoder lending its map (favor's torch op favor::decode_step calls this on its tensors).
inline void decode_step(Decoder& decoder, DecoderStateView state, TensorView q, TensorView k,
                        TensorView v, MutableTensorView out,
                        const std::optional<KeyMaskView>& key_mask = {}) {
  decoder.step(state, q, k, v, out, key_mask);
}

}  // namespace favor
