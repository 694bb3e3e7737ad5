#pragma once
/// \file decoder.hpp
/// Streaming (autoregressive) FAVOR+ decoding with an O(m Dv) state per (batch, head).
#include <cstdint>
#include <optional>
#include <vector>

#include "favor/features.hpp"
#include "favor/projection.hpp"
#include "favor/tensor.hpp"

namespace favor {

struct DecoderOptions {
  Kernel kernel = Kernel::positive;
  std::optional<double> scale;  ///< default 1/sqrt(D), D = projection.d()
  /// FAVOR++ / FAVOR# parameters, required for those kernels (a fixed or calibrated fit:
  /// the decoder never sees future tokens). heads must be 1 or batch * heads.
  std::optional<KernelFit> fit;
};

/// Holds, per (batch, head), S = sum phi(k) v^T (F x Dv), s = sum phi(k) (F), and the
/// running key stabiliser. append and query cost O(F (D + Dv)) per token and head,
/// whatever the position. query after append of tokens 0..i equals row i of causal
/// favor_attention. Not thread-safe: one decoder per thread.
class Decoder {
 public:
  Decoder(int64_t batch, int64_t heads, int64_t dv, Projection w,
          const DecoderOptions& options = {});

  /// Appends T tokens: k [B, H, T, D], v [B, H, T, Dv].
  void append(TensorView k, TensorView v);
  /// Attends each of T queries q [B, H, T, D] to the current state; out [B, H, T, Dv].
  /// A head with no appended token yields zeros.
  void query(TensorView q, MutableTensorView out) const;
  Tensor query(TensorView q) const;

  /// Tokens appended so far.
  int64_t position() const { return position_; }
  /// Bytes held by the state (S, s and the stabilisers): fixed at construction, whatever
  /// the position.
  int64_t state_bytes() const {
    return static_cast<int64_t>(S_.size() * sizeof(float) + s_.size() * sizeof(float) +
                                max_.size() * sizeof(double));
  }
  void reset();

  int64_t batch() const { return batch_; }
  int64_t heads() const { return heads_; }
  int64_t dv() const { return dv_; }
  const Projection& projection() const { return w_; }

 private:
  int64_t batch_, heads_, dv_, features_;
  Projection w_;
  int64_t proj_heads_ = 1;    // 1, or B*H for a per-head FAVOR++ / FAVOR# fit
  std::vector<float> w_eff_;  // [proj_heads][m][d]: W, or the fitted per-head projections
  std::vector<float> bias_;   // [proj_heads][m]: FAVOR++ / FAVOR# log biases (else empty)
  std::vector<float> wt_;     // [proj_heads][d][m]: W^T, the per-token projection as axpys
  DecoderOptions options_;
  double sqrt_scale_;
  int64_t position_ = 0;
  std::vector<float> S_;     // [B*H][F][Dv]
  std::vector<float> s_;     // [B*H][F]
  std::vector<double> max_;  // running key log-max per (b, h)
};

}  // namespace favor
