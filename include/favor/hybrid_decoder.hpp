#pragma once
/// \file hybrid_decoder.hpp
/// Streaming hybrid attention (AttentionOptions::window, ::sinks): exact softmax on the last
/// `window` tokens and the first `sinks` kept ones, the estimator on every other token, one
/// normaliser, with a state whose size is fixed by (window, sinks, m), whatever the position.
#include <cstdint>
#include <optional>
#include <vector>

#include "favor/decoder.hpp"
#include "favor/decoder_state.hpp"
#include "favor/feature_map.hpp"
#include "favor/projection.hpp"
#include "favor/tensor.hpp"

namespace favor {

/// A HybridDecoder's state. Arrays are row-major; head bh = b * heads + h.
struct HybridDecoderState {
  int64_t batch = 0, heads = 0, d = 0, dv = 0, window = 0, sinks = 0;
  /// Tokens seen, masked ones included.
  int64_t position = 0;
  /// The estimated part: a Decoder's state, fed each token as it leaves the window.
  DecoderState linear;
  /// The ring of the last `window` tokens (slot t % window holds token t): keys
  /// [batch][heads][window][d], values [batch][heads][window][dv], and per row whether the
  /// token takes part (keep) and whether it is a sink, [batch][window] (0 or 1).
  std::vector<float> ring_k, ring_v;
  std::vector<uint8_t> ring_keep, ring_sink;
  /// The sinks, each row's first `sinks` kept tokens: keys [batch][heads][sinks][d], values
  /// [batch][heads][sinks][dv], positions [batch][sinks] (-1: not yet seen).
  std::vector<float> sink_k, sink_v;
  std::vector<int64_t> sink_pos;
};

/// A HybridDecoder's state in caller memory, borrowed (not owned), with HybridDecoderState's
/// layout: linear.sums, .log_max and .row_positions as DecoderStateView's (linear.position
/// unused: the linear state has folded max(position - window, 0) tokens), *position the
/// tokens seen, the ring and the sinks as HybridDecoderState's arrays (ring_keep and
/// ring_sink 0 or 1). The decoder's functional calls read and write it in place (favor's torch
/// op favor::hybrid_decode_step passes its tensors' memory); the extents are the decoder's.
struct HybridDecoderStateView {
  DecoderStateView linear;
  int64_t* position = nullptr;
  float* ring_k = nullptr;
  float* ring_v = nullptr;
  uint8_t* ring_keep = nullptr;
  uint8_t* ring_sink = nullptr;
  float* sink_k = nullptr;
  float* sink_v = nullptr;
  int64_t* sink_pos = nullptr;
};

/// Decoding with hybrid attention. query after the tokens 0..i equals row i of causal
/// favor_attention with the same map, window, sinks, decay and key mask (decay counts from
/// the window's edge: the linear state decays as the Decoder it is, fed the tokens that leave
/// the window). Not thread-safe: one decoder per thread.
class HybridDecoder {
 public:
  /// window >= 0, sinks >= 0, not both 0 (that is the plain Decoder). options as Decoder's.
  HybridDecoder(int64_t batch, int64_t heads, int64_t dv, Projection w, int64_t window,
                int64_t sinks, const DecoderOptions& options = {});
  HybridDecoder(int64_t batch, int64_t heads, int64_t dv, FeatureMap map, int64_t window,
                int64_t sinks, const DecoderOptions& options = {});

  /// Adds T tokens k [B, H, T, D], v [B, H, T, Dv]; key_mask [B, T], nonzero = the token
  /// takes part (a masked token is never attended to and is no sink).
  void append(TensorView k, TensorView v, const std::optional<KeyMaskView>& key_mask = {});
  /// Each of T queries q [B, H, T, D] reads the current state; out [B, H, T, Dv].
  void query(TensorView q, MutableTensorView out) const;
  Tensor query(TensorView q) const;
  /// One token per row: append then query, in one fused pass (the token leaving the window
  /// folded into the linear state and the query's exact and estimated parts merged in the
  /// plain Decoder::step's kernel call). Equal to append then query up to the rounding of
  /// the projections (one GEMM for the step's keys and queries instead of a matvec per row);
  /// allocates nothing once the decoder's workspace has grown to the batch.
  void step(TensorView q, TensorView k, TensorView v, MutableTensorView out,
            const std::optional<KeyMaskView>& key_mask = {});
  Tensor step(TensorView q, TensorView k, TensorView v,
              const std::optional<KeyMaskView>& key_mask = {});
  /// A prompt: from an empty state, causal hybrid favor_attention (one call) and the state
  /// it leaves; after earlier tokens, token by token. out [B, H, T, Dv].
  void prefill(TensorView q, TensorView k, TensorView v, MutableTensorView out,
               const std::optional<KeyMaskView>& key_mask = {});
  Tensor prefill(TensorView q, TensorView k, TensorView v,
                 const std::optional<KeyMaskView>& key_mask = {});

  /// The functional forms: the calls above on a state held elsewhere (of this decoder's
  /// extents; from an empty one, all zero but log_max -inf and sink_pos -1), read and written
  /// in place. Bit for bit the calls above when the view holds the same values.
  void append(HybridDecoderStateView state, TensorView k, TensorView v,
              const std::optional<KeyMaskView>& key_mask = {});
  void query(const HybridDecoderStateView& state, TensorView q, MutableTensorView out) const;
  void step(HybridDecoderStateView state, TensorView q, TensorView k, TensorView v,
            MutableTensorView out, const std::optional<KeyMaskView>& key_mask = {});
  void prefill(HybridDecoderStateView state, TensorView q, TensorView k, TensorView v,
               MutableTensorView out, const std::optional<KeyMaskView>& key_mask = {});

  /// Keeps batch rows indices[0], indices[1], ... (Decoder::select's rules).
  void select(const std::vector<int64_t>& indices);
  void reset();
  HybridDecoderState state() const;
  /// Replaces the state, checked against this decoder's extents (favor::Error naming the
  /// field).
  void load_state(const HybridDecoderState& state);

  int64_t position() const { return position_; }
  int64_t batch() const { return batch_; }
  int64_t heads() const { return heads_; }
  int64_t dv() const { return dv_; }
  int64_t d() const { return d_; }
  /// F: the linear state's features per token.
  int64_t features() const { return linear_.features(); }
  int64_t window() const { return window_; }
  int64_t sinks() const { return sinks_; }
  /// Bytes of the state: the linear state, the ring and the sinks; fixed.
  int64_t state_bytes() const;

 private:
  HybridDecoderStateView own();
  void push(HybridDecoderStateView& s, const uint8_t* keep, const TensorView& kv,
            const TensorView& vv, int64_t t);
  void build(HybridDecoderStateView& s, TensorView k, TensorView v,
             const std::optional<KeyMaskView>& key_mask);
  // The sinks token t of each row (keep[b]: it takes part) becomes, copied; sink[b] set.
  void take_sinks(HybridDecoderStateView& s, const uint8_t* keep, const TensorView& kv,
                  const TensorView& vv, int64_t t, uint8_t* sink) const;
  // Ring slot `slot` of row b: token t of kv, vv (the caller's views) with its flags.
  void write_ring(HybridDecoderStateView& s, int64_t slot, int64_t b, uint8_t keep, uint8_t sink,
                  const TensorView& kv, const TensorView& vv, int64_t t) const;
  // The linear state's view (its position: the tokens folded, in *folded).
  DecoderStateView linear_view(const HybridDecoderStateView& s, int64_t* folded) const;
  bool kept(const std::optional<KeyMaskView>& mask, int64_t b, int64_t t) const {
    return !mask || mask->at(b, t);
  }

  int64_t batch_, heads_, d_, dv_, window_, sinks_;
  FeatureMap map_;
  DecoderOptions options_;  // the decay (the map carries the rest)
  double scale_;
  Decoder linear_;  // lends its map, projections and step workspace; holds no state
  int64_t position_ = 0;
  std::vector<float> sums_;       // the linear state: [B*H][F][Dv + 1]
  std::vector<double> log_max_;   // [B*H]
  std::vector<int64_t> row_pos_;  // [B]
  std::vector<float> ring_k_, ring_v_, sink_k_, sink_v_;
  std::vector<uint8_t> ring_keep_, ring_sink_;
  std::vector<int64_t> sink_pos_;
  // a step's workspace: flags per row, each head's log constant (the query weight's; fixed
  // by the map)
  std::vector<uint8_t> keep_, sink_, fold_, sink_live_;
  std::vector<double> log_const_;
};

}  // namespace favor
