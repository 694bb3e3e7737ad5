// Streaming hybrid attention (favor/hybrid_decoder.hpp): a ring of the last `window` tokens,
// the sinks, and a Decoder fed each token as it leaves the window; a query merges the exact
// part (ring and sinks) with the Decoder's estimated sums (Decoder::query_parts) in log space,
// as hybrid_forward merges its parts (src/hybrid.cpp).
#include "favor/hybrid_decoder.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/decoder_state_check.hpp"
#include "core/feature_map_params.hpp"
#include "core/params.hpp"
#include "core/validate.hpp"
#include "favor/attention.hpp"
#include "favor/error.hpp"
#include "hybrid.hpp"
#include "kernels/backend.hpp"

namespace favor {
namespace {

int64_t checked(int64_t value, const char* name) {
  if (value < 0) throw Error(std::string(name) + ": " + std::to_string(value) + " must be >= 0");
  return value;
}

double resolved_scale(const FeatureMap& map) {
  return map.scale ? *map.scale : 1.0 / std::sqrt(double(map.d()));
}

// Row t of head (b, h) of a [B, H, T, X] view.
const float* row_of(const TensorView& t, int64_t b, int64_t h, int64_t i) {
  return t.data + b * t.strides[0] + h * t.strides[1] + i * t.strides[2];
}

// Token t of head (b, h) of the views kv, vv (strided) into the dense rows k_out, v_out: a
// sink's or a ring slot's key and value.
void copy_key_value(const TensorView& kv, const TensorView& vv, int64_t b, int64_t h, int64_t t,
                    float* k_out, float* v_out) {
  const float* kr = row_of(kv, b, h, t);
  const float* vr = row_of(vv, b, h, t);
  for (int64_t x = 0; x < kv.shape[3]; ++x) k_out[x] = kr[x * kv.strides[3]];
  for (int64_t x = 0; x < vv.shape[3]; ++x) v_out[x] = vr[x * vv.strides[3]];
}

// The token in ring slot `slot` of every head, as [B, H, 1, X] views of the ring: the one
// leaving the window (push and step fold it into the linear state).
std::pair<TensorView, TensorView> ring_slot(const HybridDecoderStateView& s, int64_t slot,
                                            int64_t batch, int64_t heads, int64_t window, int64_t d,
                                            int64_t dv) {
  return {
      TensorView{s.ring_k + slot * d, {batch, heads, 1, d}, {heads * window * d, window * d, d, 1}},
      TensorView{
          s.ring_v + slot * dv, {batch, heads, 1, dv}, {heads * window * dv, window * dv, dv, 1}}};
}

}  // namespace

void Decoder::query_parts(TensorView q, float* rows, double* shift) const {
  if (S_.empty()) {  // nothing appended: every head is empty
    detail::check_step(q, batch_, heads_, w_.d(), "q", "D");
    const int64_t n = batch_ * heads_ * q.shape[2];
    std::fill(rows, rows + n * (dv_ + 1), 0.0f);
    std::fill(shift, shift + n, -INFINITY);
    return;
  }
  DecoderStateView own{const_cast<float*>(S_.data()), const_cast<double*>(max_.data()),
                       const_cast<int64_t*>(row_pos_.data()), nullptr};
  query_parts(own, q, rows, shift);
}

void Decoder::query_parts(const DecoderStateView& s, TensorView q, float* rows,
                          double* shift) const {
  detail::check_step(q, batch_, heads_, w_.d(), "q", "D");
  const int64_t T = q.shape[2], heads = batch_ * heads_;
  kernels::DecoderQuery dq{};
  kernels::AttentionParams& p = dq.step;
  p = detail::attention_params(q, {}, {}, {batch_, heads_, T, 0, w_.d(), dv_}, 1.0, std::nullopt);
  p.out = nullptr;
  p.map = map_->params();
  dq.wt = wt_.data();
  dq.sums = s.sums;
  dq.part_rows = rows;
  dq.part_shift = shift;
  dq.log_max = s.log_max;
  kernels::backend().decoder_query(dq);
  const kernels::FeatureParams fp = map_->params();
  const double norm = detail::norm_weight(*map_, fp);
  for (int64_t bh = 0; bh < heads; ++bh) {
    const int64_t b = bh / heads_, h = bh % heads_;
    const double constant = detail::head_log_constant(*map_, bh);
    for (int64_t t = 0; t < T; ++t) {
      double& x = shift[bh * T + t];
      // the query's decay clock: the last kept token's (the kernel weighs key j by its clock)
      if (!std::isinf(x))
        x += kernels::query_log_weight(
            fp, bh, norm, kernels::squared_norm(row_of(q, b, h, t), fp.d, q.strides[3]), constant,
            s.row_positions[b] - 1);
    }
  }
}

HybridDecoder::HybridDecoder(int64_t batch, int64_t heads, int64_t dv, Projection w, int64_t window,
                             int64_t sinks, const DecoderOptions& options)
    : HybridDecoder(batch, heads, dv, detail::map_of(w, options), window, sinks,
                    detail::without_map(options)) {}

HybridDecoder::HybridDecoder(int64_t batch, int64_t heads, int64_t dv, FeatureMap map,
                             int64_t window, int64_t sinks, const DecoderOptions& options)
    : batch_(batch),
      heads_(heads),
      d_(map.d()),
      dv_(dv),
      window_(checked(window, "window")),
      sinks_(checked(sinks, "sinks")),
      map_(map),
      options_(options),
      scale_(resolved_scale(map)),
      linear_(batch, heads, dv, map, options) {
  if (window == 0 && sinks == 0)
    throw Error("window, sinks: both 0 is the plain method; use favor::Decoder");
  reset();
}

void HybridDecoder::reset() {
  position_ = 0;
  for (auto* v : {&sums_, &ring_k_, &ring_v_, &sink_k_, &sink_v_}) v->clear();
  log_max_.clear();
  row_pos_.clear();
  ring_keep_.clear();
  ring_sink_.clear();
  sink_pos_.clear();
  const int64_t BH = batch_ * heads_;
  log_const_.resize(static_cast<size_t>(BH));
  for (int64_t bh = 0; bh < BH; ++bh)
    log_const_[size_t(bh)] = detail::head_log_constant(*linear_.map_, bh);
}

// The decoder's own state, allocated at its first use (a decoder that only lends its map to
// the functional calls holds none).
HybridDecoderStateView HybridDecoder::own() {
  if (sums_.empty()) {
    const int64_t BH = batch_ * heads_;
    sums_.assign(static_cast<size_t>(BH * linear_.features() * (dv_ + 1)), 0.0f);
    log_max_.assign(static_cast<size_t>(BH), -INFINITY);
    row_pos_.assign(static_cast<size_t>(batch_), 0);
    ring_k_.assign(static_cast<size_t>(BH * window_ * d_), 0.0f);
    ring_v_.assign(static_cast<size_t>(BH * window_ * dv_), 0.0f);
    ring_keep_.assign(static_cast<size_t>(batch_ * window_), 0);
    ring_sink_.assign(static_cast<size_t>(batch_ * window_), 0);
    sink_k_.assign(static_cast<size_t>(BH * sinks_ * d_), 0.0f);
    sink_v_.assign(static_cast<size_t>(BH * sinks_ * dv_), 0.0f);
    sink_pos_.assign(static_cast<size_t>(batch_ * sinks_), -1);
  }
  return {{sums_.data(), log_max_.data(), row_pos_.data(), nullptr},
          &position_,
          ring_k_.data(),
          ring_v_.data(),
          ring_keep_.data(),
          ring_sink_.data(),
          sink_k_.data(),
          sink_v_.data(),
          sink_pos_.data()};
}

DecoderStateView HybridDecoder::linear_view(const HybridDecoderStateView& s,
                                            int64_t* folded) const {
  *folded = std::max<int64_t>(*s.position - window_, 0);
  return {s.linear.sums, s.linear.log_max, s.linear.row_positions, folded};
}

int64_t HybridDecoder::state_bytes() const {  // by the extents: allocated or not
  const int64_t BH = batch_ * heads_;
  return linear_.state_bytes() + int64_t(sizeof(float)) * BH * (window_ + sinks_) * (d_ + dv_) +
         2 * batch_ * window_ + int64_t(sizeof(int64_t)) * batch_ * sinks_;
}

void HybridDecoder::take_sinks(HybridDecoderStateView& s, const uint8_t* keep, const TensorView& kv,
                               const TensorView& vv, int64_t t, uint8_t* sink) const {
  for (int64_t b = 0; b < batch_; ++b) {
    sink[b] = 0;
    if (!keep[b]) continue;
    int64_t count = 0;
    while (count < sinks_ && s.sink_pos[b * sinks_ + count] >= 0) ++count;
    if (count == sinks_) continue;
    sink[b] = 1;
    s.sink_pos[b * sinks_ + count] = *s.position;
    for (int64_t h = 0; h < heads_; ++h) {
      const int64_t o = (b * heads_ + h) * sinks_ + count;
      copy_key_value(kv, vv, b, h, t, s.sink_k + o * d_, s.sink_v + o * dv_);
    }
  }
}

// Token t of every row (k, v: rows of kv, vv at token index t of the caller's views)
// enters: the token one window back leaves the ring for the linear state (sinks never do),
// the row's first kept tokens become sinks.
void HybridDecoder::push(HybridDecoderStateView& s, const uint8_t* keep, const TensorView& kv,
                         const TensorView& vv, int64_t t) {
  const int64_t tok = *s.position;
  sink_.resize(static_cast<size_t>(batch_));
  fold_.resize(static_cast<size_t>(batch_));
  take_sinks(s, keep, kv, vv, t, sink_.data());
  int64_t folded = 0;
  DecoderStateView lin = linear_view(s, &folded);
  // the token (or, with a window, the one leaving it) for the linear state
  if (window_ == 0) {
    for (int64_t b = 0; b < batch_; ++b) fold_[b] = keep[b] && !sink_[b];
    const TensorView k1{row_of(kv, 0, 0, t), {batch_, heads_, 1, d_}, kv.strides};
    const TensorView v1{row_of(vv, 0, 0, t), {batch_, heads_, 1, dv_}, vv.strides};
    linear_.append(lin, k1, v1, KeyMaskView::contiguous(fold_.data(), batch_, 1));
  } else {
    const int64_t slot = tok % window_;
    if (tok >= window_) {
      for (int64_t b = 0; b < batch_; ++b)
        fold_[b] = s.ring_keep[b * window_ + slot] && !s.ring_sink[b * window_ + slot];
      const auto [k1, v1] = ring_slot(s, slot, batch_, heads_, window_, d_, dv_);
      linear_.append(lin, k1, v1, KeyMaskView::contiguous(fold_.data(), batch_, 1));
    }
    for (int64_t b = 0; b < batch_; ++b) write_ring(s, slot, b, keep[b], sink_[b], kv, vv, t);
  }
  *s.position = tok + 1;
}

void HybridDecoder::write_ring(HybridDecoderStateView& s, int64_t slot, int64_t b, uint8_t keep,
                               uint8_t sink, const TensorView& kv, const TensorView& vv,
                               int64_t t) const {
  s.ring_keep[b * window_ + slot] = keep;
  s.ring_sink[b * window_ + slot] = sink;
  for (int64_t h = 0; h < heads_; ++h) {
    const int64_t o = (b * heads_ + h) * window_ + slot;
    copy_key_value(kv, vv, b, h, t, s.ring_k + o * d_, s.ring_v + o * dv_);
  }
}

void HybridDecoder::append(TensorView k, TensorView v, const std::optional<KeyMaskView>& key_mask) {
  append(own(), k, v, key_mask);
}

void HybridDecoder::append(HybridDecoderStateView s, TensorView k, TensorView v,
                           const std::optional<KeyMaskView>& key_mask) {
  detail::check_step(k, batch_, heads_, d_, "k", "D");
  detail::check_step(v, batch_, heads_, dv_, "v", "Dv");
  if (k.shape[2] != v.shape[2])
    throw Error("k " + shape_string(k.shape) + ", v " + shape_string(v.shape) +
                ": same token count T");
  if (key_mask) detail::check_key_mask(*key_mask, batch_, k.shape[2], "T");  // (finite: check_step)
  if (*s.position == 0) {
    build(s, k, v, key_mask);
    return;
  }
  keep_.resize(static_cast<size_t>(batch_));
  for (int64_t t = 0; t < k.shape[2]; ++t) {
    for (int64_t b = 0; b < batch_; ++b) keep_[b] = kept(key_mask, b, t);
    push(s, keep_.data(), k, v, t);
  }
}

// The state after the prompt k, v from an empty one, in bulk: the sinks, the tokens before
// the last `window` into the linear state at once, the last `window` into the ring.
void HybridDecoder::build(HybridDecoderStateView& s, TensorView k, TensorView v,
                          const std::optional<KeyMaskView>& key_mask) {
  const int64_t T = k.shape[2], folded = std::max<int64_t>(T - window_, 0);
  std::vector<uint8_t> sink(static_cast<size_t>(batch_ * T), 0);
  for (int64_t b = 0; b < batch_; ++b) {
    int64_t count = 0;
    for (int64_t t = 0; t < T && count < sinks_; ++t) {
      if (!kept(key_mask, b, t)) continue;
      sink[b * T + t] = 1;
      s.sink_pos[b * sinks_ + count] = t;
      for (int64_t h = 0; h < heads_; ++h) {
        const int64_t o = (b * heads_ + h) * sinks_ + count;
        for (int64_t x = 0; x < d_; ++x) s.sink_k[o * d_ + x] = k.at(b, h, t, x);
        for (int64_t x = 0; x < dv_; ++x) s.sink_v[o * dv_ + x] = v.at(b, h, t, x);
      }
      ++count;
    }
  }
  if (folded > 0) {
    std::vector<uint8_t> fold(static_cast<size_t>(batch_ * folded));
    for (int64_t b = 0; b < batch_; ++b)
      for (int64_t t = 0; t < folded; ++t)
        fold[b * folded + t] = kept(key_mask, b, t) && !sink[b * T + t];
    const TensorView kf{k.data, {batch_, heads_, folded, d_}, k.strides};
    const TensorView vf{v.data, {batch_, heads_, folded, dv_}, v.strides};
    int64_t none = 0;
    linear_.append(linear_view(s, &none), kf, vf,
                   KeyMaskView::contiguous(fold.data(), batch_, folded));
  }
  for (int64_t t = folded; t < T; ++t) {
    const int64_t slot = t % window_;
    for (int64_t b = 0; b < batch_; ++b)
      write_ring(s, slot, b, kept(key_mask, b, t) ? 1 : 0, sink[b * T + t], k, v, t);
  }
  *s.position = T;
}

namespace {

// The exact part's reading of the state: ring, sinks, and which sinks lie outside the ring
// (their position at most the last token's - window), into live.
kernels::BandDecodeParams band_params(const HybridDecoderStateView& s, const TensorView& q,
                                      const MutableTensorView& out, int64_t batch, int64_t heads,
                                      int64_t d, int64_t dv, double scale, int64_t window,
                                      int64_t sinks, uint8_t* live) {
  const int64_t last = *s.position - 1;
  for (int64_t i = 0; i < batch * sinks; ++i)
    live[i] = s.sink_pos[i] >= 0 && s.sink_pos[i] <= last - window ? 1 : 0;
  kernels::BandDecodeParams p;
  p.q = q.data;
  p.q_strides = q.strides;
  p.out = out.data;
  p.out_strides = out.strides;
  p.T = q.shape[2];
  p.batch = batch;
  p.heads = heads;
  p.d = d;
  p.dv = dv;
  p.scale = scale;
  p.window = window;
  p.sinks = sinks;
  p.ring_k = s.ring_k;
  p.ring_v = s.ring_v;
  p.ring_live = s.ring_keep;
  p.sink_k = s.sink_k;
  p.sink_v = s.sink_v;
  p.sink_live = live;
  return p;
}

}  // namespace

void HybridDecoder::query(TensorView q, MutableTensorView out) const {
  query(const_cast<HybridDecoder*>(this)->own(), q, out);
}

void HybridDecoder::query(const HybridDecoderStateView& s, TensorView q,
                          MutableTensorView out) const {
  detail::check_step(q, batch_, heads_, d_, "q", "D");
  detail::check_output(out, {batch_, heads_, q.shape[2], dv_}, "out", {q});
  const int64_t T = q.shape[2], heads = batch_ * heads_, ld = dv_ + 1;
  std::vector<float> rows(static_cast<size_t>(heads * T * ld));
  std::vector<double> shift(static_cast<size_t>(heads * T));
  linear_.query_parts(s.linear, q, rows.data(), shift.data());
  std::vector<uint8_t> live(static_cast<size_t>(batch_ * sinks_));
  kernels::BandDecodeParams p =
      band_params(s, q, out, batch_, heads_, d_, dv_, scale_, window_, sinks_, live.data());
  p.part_rows = rows.data();
  p.part_shift = shift.data();
  kernels::backend().band_decode(p);
}

Tensor HybridDecoder::query(TensorView q) const {
  detail::check_step(q, batch_, heads_, d_, "q", "D");
  Tensor out({batch_, heads_, q.shape[2], dv_});
  query(q, out.mutable_view());
  return out;
}

void HybridDecoder::step(TensorView q, TensorView k, TensorView v, MutableTensorView out,
                         const std::optional<KeyMaskView>& key_mask) {
  step(own(), q, k, v, out, key_mask);
}

// The step as the batch formula with one query: the sinks and the ring's flags here
// (bookkeeping), then one kernel call that folds the token leaving the window into the linear
// state, writes the entering one into its ring slot and merges the query's two parts
// (kernels::DecoderStep).
void HybridDecoder::step(HybridDecoderStateView s, TensorView q, TensorView k, TensorView v,
                         MutableTensorView out, const std::optional<KeyMaskView>& key_mask) {
  detail::check_decode_step(q, k, v, out, key_mask, batch_, heads_, d_, dv_);  // finite too
  const int64_t tok = *s.position;
  keep_.resize(static_cast<size_t>(batch_));
  sink_.resize(static_cast<size_t>(batch_));
  fold_.resize(static_cast<size_t>(batch_));
  sink_live_.resize(static_cast<size_t>(batch_ * sinks_));
  for (int64_t b = 0; b < batch_; ++b) keep_[b] = kept(key_mask, b, 0);
  take_sinks(s, keep_.data(), k, v, 0, sink_.data());
  // The token folded into the linear state: this one (no window), or the one leaving the
  // ring's slot, which the kernel reads there before the new token takes the slot.
  TensorView kf{}, vf{};
  bool folds = true;
  int64_t slot = 0;
  if (window_ == 0) {
    for (int64_t b = 0; b < batch_; ++b) fold_[b] = keep_[b] && !sink_[b];
    kf = k;
    vf = v;
  } else {
    slot = tok % window_;
    folds = tok >= window_;
    if (folds) {  // the leaving token, read in its slot by the kernel before the new one enters
      for (int64_t b = 0; b < batch_; ++b)
        fold_[b] = s.ring_keep[b * window_ + slot] && !s.ring_sink[b * window_ + slot];
      std::tie(kf, vf) = ring_slot(s, slot, batch_, heads_, window_, d_, dv_);
    }
    for (int64_t b = 0; b < batch_; ++b) {  // the slot's flags; its rows are the kernel's
      s.ring_keep[b * window_ + slot] = keep_[b];
      s.ring_sink[b * window_ + slot] = sink_[b];
    }
  }
  *s.position = tok + 1;  // the exact part reads the ring with the new token
  const kernels::BandDecodeParams band =
      band_params(s, q, out, batch_, heads_, d_, dv_, scale_, window_, sinks_, sink_live_.data());
  const std::optional<KeyMaskView> fold_mask =
      folds ? std::optional<KeyMaskView>(KeyMaskView::contiguous(fold_.data(), batch_, 1))
            : std::nullopt;
  kernels::DecoderStep ds{};
  kernels::AttentionParams& p = ds.step;
  p = detail::attention_params(q, folds ? kf : q,
                               folds ? vf : TensorView{q.data, {batch_, heads_, 1, dv_}, q.strides},
                               {batch_, heads_, 1, 1, d_, dv_}, 1.0, fold_mask);
  if (!folds) {
    p.k = nullptr;
    p.v = nullptr;
  }
  p.out = out.data;
  p.out_strides = out.strides;
  p.map = linear_.map_->params();
  ds.wt = linear_.wt_.data();
  ds.sums = s.linear.sums;
  ds.log_max = s.linear.log_max;
  ds.row_positions = s.linear.row_positions;
  ds.workspace = &linear_.step_ws_;
  ds.workspace_d = &linear_.step_ws_d_;
  ds.band = &band;
  ds.weight = kernels::QueryWeight{detail::norm_weight(*linear_.map_, p.map), log_const_.data()};
  if (window_ > 0) {
    ds.enter_k = k.data;
    ds.enter_k_strides = k.strides;
    ds.enter_v = v.data;
    ds.enter_v_strides = v.strides;
    ds.ring_k_out = s.ring_k;
    ds.ring_v_out = s.ring_v;
    ds.enter_slot = slot;
  }
  kernels::backend().decoder_step(ds);
  if (folds)
    for (int64_t b = 0; b < batch_; ++b)
      s.linear.row_positions[b] += kernels::clock_ticks(fold_[b], s.linear.row_positions[b]);
}

Tensor HybridDecoder::step(TensorView q, TensorView k, TensorView v,
                           const std::optional<KeyMaskView>& key_mask) {
  Tensor out({batch_, heads_, 1, dv_});
  step(q, k, v, out.mutable_view(), key_mask);
  return out;
}

void HybridDecoder::prefill(TensorView q, TensorView k, TensorView v, MutableTensorView out,
                            const std::optional<KeyMaskView>& key_mask) {
  prefill(own(), q, k, v, out, key_mask);
}

void HybridDecoder::prefill(HybridDecoderStateView s, TensorView q, TensorView k, TensorView v,
                            MutableTensorView out, const std::optional<KeyMaskView>& key_mask) {
  if (*s.position > 0) {  // after earlier tokens: token by token
    detail::check_step(q, batch_, heads_, d_, "q", "D");
    const int64_t T = q.shape[2];
    if (key_mask) detail::check_key_mask(*key_mask, batch_, T, "T");
    detail::check_output(out, {batch_, heads_, T, dv_}, "out", {q, k, v});
    std::vector<uint8_t> m(static_cast<size_t>(batch_));
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t b = 0; b < batch_; ++b) m[b] = kept(key_mask, b, t);
      auto one = [t](const TensorView& x) {
        return TensorView{
            x.data + t * x.strides[2], {x.shape[0], x.shape[1], 1, x.shape[3]}, x.strides};
      };
      const MutableTensorView row{
          out.data + t * out.strides[2], {batch_, heads_, 1, dv_}, out.strides};
      step(s, one(q), one(k), one(v), row, KeyMaskView::contiguous(m.data(), batch_, 1));
    }
    return;
  }
  AttentionOptions o;
  o.causal = true;
  o.key_mask = key_mask;
  o.decay = options_.decay;
  o.window = window_;
  o.sinks = sinks_;
  favor_attention(q, k, v, map_, out, o);  // checks q, k, v, out and the mask
  build(s, k, v, key_mask);
}

Tensor HybridDecoder::prefill(TensorView q, TensorView k, TensorView v,
                              const std::optional<KeyMaskView>& key_mask) {
  detail::check_step(q, batch_, heads_, d_, "q", "D");
  Tensor out({batch_, heads_, q.shape[2], dv_});
  prefill(q, k, v, out.mutable_view(), key_mask);
  return out;
}

void HybridDecoder::select(const std::vector<int64_t>& indices) {
  linear_.select(indices);  // the rules (row range, per-row parameter sets)
  const int64_t rows = static_cast<int64_t>(indices.size());
  log_const_ = detail::select_rows(log_const_, heads_, indices);
  if (sums_.empty()) {  // no state of its own (or none yet): the extents only
    batch_ = rows;
    return;
  }
  const int64_t F = linear_.features();
  sums_ = detail::select_rows(sums_, heads_ * F * (dv_ + 1), indices);
  log_max_ = detail::select_rows(log_max_, heads_, indices);
  row_pos_ = detail::select_rows(row_pos_, 1, indices);
  ring_k_ = detail::select_rows(ring_k_, heads_ * window_ * d_, indices);
  ring_v_ = detail::select_rows(ring_v_, heads_ * window_ * dv_, indices);
  ring_keep_ = detail::select_rows(ring_keep_, window_, indices);
  ring_sink_ = detail::select_rows(ring_sink_, window_, indices);
  sink_k_ = detail::select_rows(sink_k_, heads_ * sinks_ * d_, indices);
  sink_v_ = detail::select_rows(sink_v_, heads_ * sinks_ * dv_, indices);
  sink_pos_ = detail::select_rows(sink_pos_, sinks_, indices);
  batch_ = rows;
}

HybridDecoderState HybridDecoder::state() const {
  if (sums_.empty()) {  // nothing allocated: an empty state of these extents
    HybridDecoder fresh = *this;
    fresh.own();
    return fresh.state();
  }
  HybridDecoderState s;
  s.batch = batch_;
  s.heads = heads_;
  s.d = d_;
  s.dv = dv_;
  s.window = window_;
  s.sinks = sinks_;
  s.position = position_;
  s.linear = DecoderState{
      batch_, heads_,  linear_.features(), dv_, std::max<int64_t>(position_ - window_, 0), row_pos_,
      sums_,  log_max_};
  s.ring_k = ring_k_;
  s.ring_v = ring_v_;
  s.ring_keep = ring_keep_;
  s.ring_sink = ring_sink_;
  s.sink_k = sink_k_;
  s.sink_v = sink_v_;
  s.sink_pos = sink_pos_;
  return s;
}

void HybridDecoder::load_state(const HybridDecoderState& s) {
  auto same = [](int64_t got, int64_t want, const char* name) {
    if (got != want)
      throw Error(std::string("state.") + name + ": " + std::to_string(got) +
                  " differs from the decoder's " + std::to_string(want));
  };
  same(s.batch, batch_, "batch");
  same(s.heads, heads_, "heads");
  same(s.d, d_, "d");
  same(s.dv, dv_, "dv");
  same(s.window, window_, "window");
  same(s.sinks, sinks_, "sinks");
  auto size = [](size_t got, int64_t want, const char* name) {
    if (static_cast<int64_t>(got) != want)
      throw Error(std::string("state.") + name + ": " + std::to_string(got) +
                  " entries, the decoder's extents give " + std::to_string(want));
  };
  size(s.ring_k.size(), batch_ * heads_ * window_ * d_, "ring_k");
  size(s.ring_v.size(), batch_ * heads_ * window_ * dv_, "ring_v");
  size(s.ring_keep.size(), batch_ * window_, "ring_keep");
  size(s.ring_sink.size(), batch_ * window_, "ring_sink");
  size(s.sink_k.size(), batch_ * heads_ * sinks_ * d_, "sink_k");
  size(s.sink_v.size(), batch_ * heads_ * sinks_ * dv_, "sink_v");
  size(s.sink_pos.size(), batch_ * sinks_, "sink_pos");
  if (s.position < 0) throw Error("state.position: must be >= 0");
  for (int64_t p : s.sink_pos)
    if (p < -1 || p >= s.position)
      throw Error("state.sink_pos: " + std::to_string(p) + " must be -1 or in [0, position)");
  for (uint8_t f : s.ring_keep)
    if (f > 1) throw Error("state.ring_keep: " + std::to_string(f) + " must be 0 or 1");
  for (uint8_t f : s.ring_sink)
    if (f > 1) throw Error("state.ring_sink: " + std::to_string(f) + " must be 0 or 1");
  const int64_t folded = std::max<int64_t>(s.position - window_, 0);
  if (s.linear.position != folded)
    throw Error("state.linear.position: " + std::to_string(s.linear.position) +
                " must be max(position - window, 0) = " + std::to_string(folded) +
                " (the tokens that left the window)");
  detail::check_decoder_state(s.linear, batch_, heads_, linear_.features(), dv_);
  sums_ = s.linear.sums;
  log_max_ = s.linear.log_max;
  row_pos_ = s.linear.row_positions;
  ring_k_ = s.ring_k;
  ring_v_ = s.ring_v;
  ring_keep_ = s.ring_keep;
  ring_sink_ = s.ring_sink;
  sink_k_ = s.sink_k;
  sink_v_ = s.sink_v;
  sink_pos_ = s.sink_pos;
  position_ = s.position;
}

}  // namespace favor
