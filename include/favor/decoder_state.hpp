#pragma once
/// \file decoder_state.hpp
/// The streaming state of a Decoder or VQDecoder as plain arrays: read with state(), written
/// back with load_state() (checked), e.g. to save a generation cache or move it elsewhere.
#include <cstdint>
#include <vector>

namespace favor {

/// A favor::Decoder's state. Arrays are row-major; head bh = b * heads + h.
struct DecoderState {
  int64_t batch = 0, heads = 0, features = 0, dv = 0;
  /// Tokens appended so far, masked ones included (Decoder::position()).
  int64_t position = 0;
  /// [batch]: each row's decay clock (key j of row b is weighted gamma^-row_positions[b] at
  /// its append): the tokens appended from the row's first kept one on, masked ones after it
  /// included (kernels' clock_ticks). In [0, position].
  std::vector<int64_t> row_positions;
  /// [batch][heads][features][dv + 1]: [S | s] = sum phi(k) [v | 1]^T relative to
  /// exp(log_max); finite.
  std::vector<float> sums;
  /// [batch][heads]: the stabiliser: the true sums are exp(log_max) * sums. -inf: no key
  /// yet (sums of that head all zero); never NaN or +inf.
  std::vector<double> log_max;
};

/// A favor::Decoder's state in caller memory, borrowed (not owned), with the layout of
/// DecoderState: sums [batch][heads][features][dv + 1] float32, log_max [batch][heads]
/// float64, row_positions [batch] int64, *position. The decoder's functional calls
/// (Decoder::step(DecoderStateView, ...) and the others taking one) read and write it in
/// place; the extents are the decoder's. A tensor library keeps its state this way (favor's
/// torch op favor::decode_step passes its tensors' memory) and steps it without a copy.
/// The values must satisfy DecoderState's rules (a state from an empty one or from earlier
/// calls does; check_decoder_state checks a foreign one).
struct DecoderStateView {
  float* sums = nullptr;
  double* log_max = nullptr;
  int64_t* row_positions = nullptr;
  int64_t* position = nullptr;
};

/// A favor::VQDecoder's state. Arrays are row-major; head bh = b * heads + h.
struct VQDecoderState {
  int64_t batch = 0, heads = 0, codes = 0, dv = 0;
  /// Tokens appended so far, masked ones included (VQDecoder::position()).
  int64_t position = 0;
  /// [batch][heads][codes][dv]: per code, the sum of the values of its keys (soft VQ:
  /// weighted by p(s|k)); finite.
  std::vector<float> sums;
  /// [batch][heads][codes]: per code, its key count (soft VQ: sum of p(s|k)); finite, >= 0.
  std::vector<float> counts;
};

/// A favor::VQDecoder's state in caller memory, borrowed (not owned), with the layout of
/// VQDecoderState: sums [batch][heads][codes][dv] float32, counts [batch][heads][codes]
/// float32, *position. VQDecoder's functional calls read and write it in place (favor's
/// torch op favor::vq_decode_step passes its tensors' memory).
struct VQDecoderStateView {
  float* sums = nullptr;
  float* counts = nullptr;
  int64_t* position = nullptr;
};

}  // namespace favor
