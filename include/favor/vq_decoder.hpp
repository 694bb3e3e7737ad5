#pragma once
/// \file vq_decoder.hpp
/// Streaming Transformer-VQ decoding: per (batch, head) a per-code count and value sum.
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "favor/decoder_state.hpp"
#include "favor/tensor.hpp"

namespace favor {
namespace kernels {
class PreparedCodebook;
}

struct VQDecoderOptions {
  std::optional<double> scale;  ///< default 1/sqrt(D)
  double tau = 0.0;             ///< 0: hard VQ; > 0: soft VQ (vq.hpp)
};

/// Holds per (batch, head) the per-code value sums (c x Dv) and counts (c) of every token
/// appended so far. append and query cost O(c (D + Dv)) per token and head, whatever the
/// position; query after append of tokens 0..i equals row i of causal vq_attention. The
/// codebook [1, H or 1, c, D] is copied. Not thread-safe: one decoder per thread.
class VQDecoder {
 public:
  VQDecoder(int64_t batch, int64_t heads, int64_t dv, TensorView codebook,
            const VQDecoderOptions& options = {});

  /// Appends T tokens: k [B, H, T, D], v [B, H, T, Dv]. With key_mask [B, T] (nonzero =
  /// the token takes part) a masked token of row b adds nothing to row b's state: appending
  /// a left-padded batch with its mask equals appending each row's tokens alone; position()
  /// still counts every token.
  void append(TensorView k, TensorView v, const std::optional<KeyMaskView>& key_mask = {});
  /// Attends each of T queries q [B, H, T, D] to the current state; out [B, H, T, Dv].
  /// A head with no appended token yields zeros.
  void query(TensorView q, MutableTensorView out) const;
  Tensor query(TensorView q) const;

  /// One decode step of every row in one fused pass: append(k, v, key_mask) then query(q),
  /// q, k [B, H, 1, D], v [B, H, 1, Dv], key_mask [B, 1]; out [B, H, 1, Dv]. The same float
  /// operations as the two calls: the same bits. The out overload allocates nothing once the
  /// decoder's step workspace has grown.
  void step(TensorView q, TensorView k, TensorView v, MutableTensorView out,
            const std::optional<KeyMaskView>& key_mask = {});
  Tensor step(TensorView q, TensorView k, TensorView v,
              const std::optional<KeyMaskView>& key_mask = {});

  /// Prefill of a prompt of T tokens: q, k [B, H, T, D], v [B, H, T, Dv], key_mask [B, T];
  /// out [B, H, T, Dv]. out is causal attention over the prompt from the current state (from
  /// an empty decoder: causal vq_attention with that key mask and the default block, bit for
  /// bit the same kernel), and the decoder is left as append(k, v, key_mask) leaves it (equal
  /// up to float rounding: the block sums add in another order), each key assigned once.
  void prefill(TensorView q, TensorView k, TensorView v, MutableTensorView out,
               const std::optional<KeyMaskView>& key_mask = {});
  Tensor prefill(TensorView q, TensorView k, TensorView v,
                 const std::optional<KeyMaskView>& key_mask = {});

  /// The functional forms: the same calls on a state held elsewhere (VQDecoderStateView, of
  /// this decoder's extents), read and written in place; this decoder lends its codebook
  /// and workspace only. Bit for bit the calls above when the view holds the same values.
  void append(VQDecoderStateView state, TensorView k, TensorView v,
              const std::optional<KeyMaskView>& key_mask = {});
  void query(const float* sums, const float* counts, TensorView q, MutableTensorView out) const;
  void step(VQDecoderStateView state, TensorView q, TensorView k, TensorView v,
            MutableTensorView out, const std::optional<KeyMaskView>& key_mask = {});
  void prefill(VQDecoderStateView state, TensorView q, TensorView k, TensorView v,
               MutableTensorView out, const std::optional<KeyMaskView>& key_mask = {});

  int64_t position() const { return position_; }
  /// Bytes held by the state: fixed at construction, whatever the position.
  int64_t state_bytes() const {
    return batch_ * heads_ * codes_ * (dv_ + 1) * int64_t(sizeof(float));
  }
  void reset();

  /// A copy of the state (decoder_state.hpp).
  VQDecoderState state() const;
  /// Replaces the state by `state`, checked against this decoder's batch, heads, codes and
  /// dv (favor::Error naming the field otherwise). Loading the state() of a decoder built
  /// with the same codebook and options gives bit-identical outputs from then on.
  void load_state(const VQDecoderState& state);
  /// Keeps batch rows indices[0], indices[1], ... in that order (rows may repeat or be
  /// dropped): the new batch is indices.size(), as a beam-search cache reorders. Each index
  /// in [0, batch).
  void select(const std::vector<int64_t>& indices);

  int64_t batch() const { return batch_; }
  int64_t heads() const { return heads_; }
  int64_t dv() const { return dv_; }
  int64_t codes() const { return codes_; }

 private:
  /// The decoder's own state (allocated at its first use).
  VQDecoderStateView own();
  int64_t batch_, heads_, dv_, codes_, d_, cb_heads_;
  std::vector<float> codebook_;  // [cb_heads][c][d]
  // The codebook as the backend assigns keys with (kernels/vq_decoder_params.hpp);
  // immutable, shared by copies
  std::shared_ptr<const kernels::PreparedCodebook> prepared_;
  VQDecoderOptions options_;
  double scale_;
  int64_t position_ = 0;
  std::vector<float> sums_;     // [B*H][c][Dv]
  std::vector<float> counts_;   // [B*H][c]
  std::vector<float> step_ws_;  // step's workspace, grown only

  std::vector<float> prefill_ws_;  // [Vsum | n] per head for prefill, grown only
};

}  // namespace favor
