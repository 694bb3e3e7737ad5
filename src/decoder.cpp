// Streaming decoding: checks, the state and its bookkeeping (positions); the steps run in
// the backend (kernels/decoder_params.hpp; on the CPU, cpu/decoder_step.cpp).
#include "favor/decoder.hpp"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "core/feature_map_params.hpp"
#include "core/params.hpp"
#include "core/validate.hpp"
#include "favor/error.hpp"
#include "kernels/backend.hpp"

namespace favor {

Decoder::Decoder(int64_t batch, int64_t heads, int64_t dv, Projection w,
                 const DecoderOptions& options)
    : Decoder(batch, heads, dv, detail::map_of(w, options), detail::without_map(options)) {}

Decoder::Decoder(int64_t batch, int64_t heads, int64_t dv, FeatureMap map,
                 const DecoderOptions& options)
    : batch_(batch), heads_(heads), dv_(dv), features_(0), w_(map.projection) {
  if (batch < 1) throw Error("batch: " + std::to_string(batch) + " must be >= 1");
  if (heads < 1) throw Error("heads: " + std::to_string(heads) + " must be >= 1");
  if (dv < 1) throw Error("dv: " + std::to_string(dv) + " must be >= 1");
  detail::check_map_options(options, "Decoder");
  if (w_.m() < 1) throw Error("projection: m = " + std::to_string(w_.m()) + " must be >= 1");
  map_ = std::make_shared<const detail::ResolvedMap>(
      detail::resolve_fixed_map(map, batch, heads, options.decay));
  features_ = map.features();
  const kernels::FeatureParams fp = map_->params();
  const int64_t m = fp.m, d = fp.d;
  wt_.resize(static_cast<size_t>(fp.w_sets * m * d));
  for (int64_t g = 0; g < fp.w_sets; ++g)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t t = 0; t < d; ++t)
        wt_[static_cast<size_t>((g * d + t) * m + i)] = fp.w[(g * m + i) * d + t];
}

DecoderStateView Decoder::own() {
  if (S_.empty()) {
    S_.assign(static_cast<size_t>(batch_ * heads_ * features_ * (dv_ + 1)), 0.0f);
    max_.assign(static_cast<size_t>(batch_ * heads_), -INFINITY);
    row_pos_.assign(static_cast<size_t>(batch_), 0);
  }
  return {S_.data(), max_.data(), row_pos_.data(), &position_};
}

void Decoder::reset() {
  S_.clear();
  max_.clear();
  row_pos_.clear();
  position_ = 0;
}

void Decoder::append(TensorView k, TensorView v, const std::optional<KeyMaskView>& key_mask) {
  append(own(), k, v, key_mask);
}

void Decoder::query(TensorView q, MutableTensorView out) const {
  if (S_.empty()) {  // nothing appended: the state is zero, so is every output
    detail::check_step(q, batch_, heads_, w_.d(), "q", "D");
    detail::check_output(out, {batch_, heads_, q.shape[2], dv_}, "out", {q});
    const std::vector<float> zero(static_cast<size_t>(batch_ * heads_ * features_ * (dv_ + 1)));
    query(zero.data(), q, out);
    return;
  }
  query(S_.data(), q, out);
}

void Decoder::step(TensorView q, TensorView k, TensorView v, MutableTensorView out,
                   const std::optional<KeyMaskView>& key_mask) {
  step(own(), q, k, v, out, key_mask);
}

void Decoder::prefill(TensorView q, TensorView k, TensorView v, MutableTensorView out,
                      const std::optional<KeyMaskView>& key_mask) {
  prefill(own(), q, k, v, out, key_mask);
}

void Decoder::append(DecoderStateView s, TensorView k, TensorView v,
                     const std::optional<KeyMaskView>& key_mask) {
  detail::check_step(k, batch_, heads_, w_.d(), "k", "D");
  detail::check_step(v, batch_, heads_, dv_, "v", "Dv");
  if (k.shape[2] != v.shape[2]) {
    throw Error("k " + shape_string(k.shape) + ", v " + shape_string(v.shape) +
                ": same token count T");
  }
  if (key_mask) detail::check_key_mask(*key_mask, batch_, k.shape[2], "T");
  const int64_t T = k.shape[2];
  kernels::DecoderAppend da{};
  da.step = detail::attention_params({}, k, v, {batch_, heads_, 0, T, w_.d(), dv_}, 1.0, key_mask);
  da.step.map = map_->params();
  da.wt = wt_.data();
  da.sums = s.sums;
  da.log_max = s.log_max;
  da.row_positions = s.row_positions;
  kernels::backend().decoder_append(da);
  for (int64_t b = 0; b < batch_; ++b)
    for (int64_t j = 0; j < T; ++j)
      s.row_positions[b] +=
          kernels::clock_ticks(!key_mask || key_mask->at(b, j), s.row_positions[b]);
  *s.position += T;
}

void Decoder::query(const float* sums, TensorView q, MutableTensorView out) const {
  detail::check_step(q, batch_, heads_, w_.d(), "q", "D");
  detail::check_output(out, {batch_, heads_, q.shape[2], dv_}, "out", {q});
  kernels::DecoderQuery dq{};
  kernels::AttentionParams& p = dq.step;
  p = detail::attention_params(q, {}, {}, {batch_, heads_, q.shape[2], 0, w_.d(), dv_}, 1.0,
                               std::nullopt);
  p.out = out.data;
  p.out_strides = out.strides;
  p.map = map_->params();
  dq.wt = wt_.data();
  dq.sums = sums;
  kernels::backend().decoder_query(dq);
}

Tensor Decoder::query(TensorView q) const {
  detail::check_step(q, batch_, heads_, w_.d(), "q", "D");
  Tensor out({batch_, heads_, q.shape[2], dv_});
  query(q, out.mutable_view());
  return out;
}

void Decoder::step(DecoderStateView s, TensorView q, TensorView k, TensorView v,
                   MutableTensorView out, const std::optional<KeyMaskView>& key_mask) {
  detail::check_decode_step(q, k, v, out, key_mask, batch_, heads_, w_.d(), dv_);
  kernels::DecoderStep ds{};
  kernels::AttentionParams& p = ds.step;
  p = detail::attention_params(q, k, v, {batch_, heads_, 1, 1, w_.d(), dv_}, 1.0, key_mask);
  p.out = out.data;
  p.out_strides = out.strides;
  p.map = map_->params();
  ds.wt = wt_.data();
  ds.sums = s.sums;
  ds.log_max = s.log_max;
  ds.row_positions = s.row_positions;
  ds.workspace = &step_ws_;
  ds.workspace_d = &step_ws_d_;
  kernels::backend().decoder_step(ds);
  for (int64_t b = 0; b < batch_; ++b)
    s.row_positions[b] += kernels::clock_ticks(!key_mask || key_mask->at(b, 0), s.row_positions[b]);
  *s.position += 1;
}

Tensor Decoder::step(TensorView q, TensorView k, TensorView v,
                     const std::optional<KeyMaskView>& key_mask) {
  detail::check_step(q, batch_, heads_, w_.d(), "q", "D");
  Tensor out({batch_, heads_, 1, dv_});
  step(q, k, v, out.mutable_view(), key_mask);
  return out;
}

void Decoder::prefill(DecoderStateView s, TensorView q, TensorView k, TensorView v,
                      MutableTensorView out, const std::optional<KeyMaskView>& key_mask) {
  const int64_t T =
      detail::check_decode_prefill(q, k, v, out, key_mask, batch_, heads_, w_.d(), dv_);
  const kernels::FeatureParams fp = map_->params();
  // Each row's clock (kernels::clock_ticks) runs from its first kept token on: a row that
  // has started ticks at every token, one that has not from its first kept token (pad: the
  // leading masked tokens it skips); a row with no kept token does not tick.
  std::vector<int64_t> pad(static_cast<size_t>(batch_), 0), ticks(static_cast<size_t>(batch_), T);
  if (key_mask) {
    for (int64_t b = 0; b < batch_; ++b) {
      if (s.row_positions[b] > 0) continue;
      int64_t j = 0;
      while (j < T && !key_mask->at(b, j)) ++j;
      pad[size_t(b)] = j;
      ticks[size_t(b)] = T - j;
    }
  }
  // The causal kernel gives key j of the prompt the decay position j, as the decoder's clock
  // does up to a constant per row (row_pos - pad): a factor exp(rate (row_pos - pad)) on
  // every new key, so the state goes in with its max lowered by that much and comes out
  // raised back. Masked tokens after a kept one count in both (the distance the op's decay
  // measures).
  auto shift = [&](int64_t bh) {
    const int64_t b = bh / heads_;
    return fp.decay_rate ? fp.head_decay(bh) * double(s.row_positions[b] - pad[size_t(b)]) : 0.0;
  };
  const int64_t BH = batch_ * heads_;
  for (int64_t bh = 0; bh < BH; ++bh) s.log_max[bh] -= shift(bh);
  kernels::AttentionParams p =
      detail::attention_params(q, k, v, {batch_, heads_, T, T, w_.d(), dv_}, 1.0, key_mask);
  p.out = out.data;
  p.out_strides = out.strides;
  p.map = fp;
  p.init_states = s.sums;
  p.init_maxima = s.log_max;
  p.final_states = s.sums;
  p.final_maxima = s.log_max;
  kernels::backend().favor_causal(p);
  for (int64_t bh = 0; bh < BH; ++bh) s.log_max[bh] += shift(bh);
  for (int64_t b = 0; b < batch_; ++b) s.row_positions[b] += ticks[size_t(b)];
  *s.position += T;
}

Tensor Decoder::prefill(TensorView q, TensorView k, TensorView v,
                        const std::optional<KeyMaskView>& key_mask) {
  detail::check_step(q, batch_, heads_, w_.d(), "q", "D");
  Tensor out({batch_, heads_, q.shape[2], dv_});
  prefill(q, k, v, out.mutable_view(), key_mask);
  return out;
}

}  // namespace favor
