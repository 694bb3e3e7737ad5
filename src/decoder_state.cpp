// Reading, writing and reordering the state of the streaming decoders (decoder_state.hpp):
// plain copies of the per-(batch, head) arrays; the checks live in core/decoder_state_check.
#include <cmath>
#include <string>

#include "core/decoder_state_check.hpp"
#include "core/feature_map_params.hpp"
#include "favor/decoder.hpp"
#include "favor/error.hpp"
#include "favor/vq_decoder.hpp"

namespace favor {

DecoderState Decoder::state() const {
  if (S_.empty()) {  // nothing appended since construction or reset
    return DecoderState{
        batch_,
        heads_,
        features_,
        dv_,
        position_,
        std::vector<int64_t>(static_cast<size_t>(batch_), 0),
        std::vector<float>(static_cast<size_t>(batch_ * heads_ * features_ * (dv_ + 1))),
        std::vector<double>(static_cast<size_t>(batch_ * heads_), -INFINITY)};
  }
  return DecoderState{batch_, heads_, features_, dv_, position_, row_pos_, S_, max_};
}

void Decoder::load_state(const DecoderState& state) {
  detail::check_decoder_state(state, batch_, heads_, features_, dv_);
  S_ = state.sums;
  max_ = state.log_max;
  row_pos_ = state.row_positions;
  position_ = state.position;
}

void Decoder::select(const std::vector<int64_t>& indices) {
  detail::check_row_indices(indices, batch_);
  // Parameter sets are picked by bh % sets (cpu/feature_params.hpp): 1 or H sets follow
  // any batch, B * H sets (B > 1) belong to the old rows.
  const kernels::FeatureParams fp = map_->params();
  const int64_t per_row = batch_ * heads_;
  if (batch_ > 1 && (fp.w_sets == per_row || fp.bias_sets == per_row || fp.lambda_sets == per_row ||
                     fp.decay_sets == per_row)) {
    throw Error("indices: the decoder's map has per-(batch, head) parameters (batch * heads = " +
                std::to_string(per_row) +
                " sets: a fit or learned map of that many heads), which cannot follow a "
                "reordered batch; use 1 parameter set (or heads sets for a learned map)");
  }
  const auto new_batch = static_cast<int64_t>(indices.size());
  own();
  S_ = detail::select_rows(S_, heads_ * features_ * (dv_ + 1), indices);
  max_ = detail::select_rows(max_, heads_, indices);
  row_pos_ = detail::select_rows(row_pos_, 1, indices);
  batch_ = new_batch;
}

VQDecoderState VQDecoder::state() const {
  if (sums_.empty()) {  // nothing appended since construction or reset
    return VQDecoderState{batch_,
                          heads_,
                          codes_,
                          dv_,
                          position_,
                          std::vector<float>(static_cast<size_t>(batch_ * heads_ * codes_ * dv_)),
                          std::vector<float>(static_cast<size_t>(batch_ * heads_ * codes_))};
  }
  return VQDecoderState{batch_, heads_, codes_, dv_, position_, sums_, counts_};
}

void VQDecoder::load_state(const VQDecoderState& state) {
  detail::check_vq_decoder_state(state, batch_, heads_, codes_, dv_);
  sums_ = state.sums;
  counts_ = state.counts;
  position_ = state.position;
}

void VQDecoder::select(const std::vector<int64_t>& indices) {
  detail::check_row_indices(indices, batch_);
  own();
  sums_ = detail::select_rows(sums_, heads_ * codes_ * dv_, indices);
  counts_ = detail::select_rows(counts_, heads_ * codes_, indices);
  batch_ = static_cast<int64_t>(indices.size());
}

}  // namespace favor
