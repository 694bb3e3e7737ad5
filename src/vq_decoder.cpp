// Streaming Transformer-VQ decoding (math.md s.6). Per (batch, head) the state is, per code
// s, the count n_s of the keys assigned to it and the sum of their values (soft VQ: both
// weighted by p(s|k)). A query attends to the codes: y = sum_s e_s sums_s / sum_s e_s n_s
// with e_s = exp(scale q.C_s - m). That is exact softmax attention over the quantised keys
// of every token appended so far, in O(c (D + Dv)) per token and head whatever the position.
//
// The batch causal kernel splits the sequence into blocks of L tokens and attends directly
// to the open block, because a query there must not see the later keys of its own block.
// A decoder appends token i before it queries row i and every appended token precedes every
// later query: its blocks have length L = 1, the cache alone is exact, and no open block is
// kept.
//
// Here: checks, the state and its bookkeeping; the steps run in the backend
// (kernels/vq_decoder_params.hpp; on the CPU, cpu/vq_decoder_step.cpp).
#include "favor/vq_decoder.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "core/params.hpp"
#include "core/validate.hpp"
#include "core/vq_validate.hpp"
#include "favor/error.hpp"
#include "kernels/backend.hpp"

namespace favor {
namespace {

// The params of a step: the decoder's sizes and codebook; the caller sets the tokens.
// The kernel parameters of a decoder call over q, k, v (empty views where the call has
// none) of shape s: the shared AttentionParams (detail::attention_params) and the codebook.
kernels::VQParams step_params(const TensorView& q, const TensorView& k, const TensorView& v,
                              const detail::AttentionShape& s,
                              const std::optional<KeyMaskView>& key_mask,
                              const std::vector<float>& codebook, int64_t codes, int64_t cb_heads,
                              float scale, float tau) {
  kernels::VQParams p{};
  p.base = detail::attention_params(q, k, v, s, 1.0, key_mask);
  p.codebook = codebook.data();
  p.codes = codes;
  p.codebook_head_stride = cb_heads == 1 ? 0 : codes * s.d;
  p.scale = scale;
  p.tau = tau;
  return p;
}

}  // namespace

VQDecoder::VQDecoder(int64_t batch, int64_t heads, int64_t dv, TensorView codebook,
                     const VQDecoderOptions& options)
    : batch_(batch), heads_(heads), dv_(dv), codes_(0), d_(0), cb_heads_(0), options_(options) {
  if (batch < 1) throw Error("batch: " + std::to_string(batch) + " must be >= 1");
  if (heads < 1) throw Error("heads: " + std::to_string(heads) + " must be >= 1");
  if (dv < 1) throw Error("dv: " + std::to_string(dv) + " must be >= 1");
  // The codebook fixes D: keys and queries are checked against it.
  detail::check_codebook(codebook, heads, codebook.shape[3]);
  detail::check_vq_options(options.tau, 0);
  cb_heads_ = codebook.shape[1];
  codes_ = codebook.shape[2];
  d_ = codebook.shape[3];
  scale_ = detail::resolve_scale(options.scale, d_);
  codebook_ = detail::contiguous_codebook(codebook);
  prepared_ = kernels::backend().vq_prepare_codebook(codebook_.data(), cb_heads_, codes_, d_);
}

VQDecoderStateView VQDecoder::own() {
  if (sums_.empty()) {
    sums_.assign(static_cast<size_t>(batch_ * heads_ * codes_ * dv_), 0.0f);
    counts_.assign(static_cast<size_t>(batch_ * heads_ * codes_), 0.0f);
  }
  return {sums_.data(), counts_.data(), &position_};
}

void VQDecoder::reset() {
  sums_.clear();
  counts_.clear();
  position_ = 0;
}

void VQDecoder::append(TensorView k, TensorView v, const std::optional<KeyMaskView>& key_mask) {
  append(own(), k, v, key_mask);
}

void VQDecoder::query(TensorView q, MutableTensorView out) const {
  if (sums_.empty()) {  // nothing appended: the state is zero, so is every output
    const std::vector<float> sums(static_cast<size_t>(batch_ * heads_ * codes_ * dv_));
    const std::vector<float> counts(static_cast<size_t>(batch_ * heads_ * codes_));
    query(sums.data(), counts.data(), q, out);
    return;
  }
  query(sums_.data(), counts_.data(), q, out);
}

void VQDecoder::step(TensorView q, TensorView k, TensorView v, MutableTensorView out,
                     const std::optional<KeyMaskView>& key_mask) {
  step(own(), q, k, v, out, key_mask);
}

void VQDecoder::prefill(TensorView q, TensorView k, TensorView v, MutableTensorView out,
                        const std::optional<KeyMaskView>& key_mask) {
  prefill(own(), q, k, v, out, key_mask);
}

void VQDecoder::append(VQDecoderStateView s, TensorView k, TensorView v,
                       const std::optional<KeyMaskView>& key_mask) {
  detail::check_step(k, batch_, heads_, d_, "k", "D");
  detail::check_step(v, batch_, heads_, dv_, "v", "Dv");
  if (k.shape[2] != v.shape[2]) {
    throw Error("k " + shape_string(k.shape) + ", v " + shape_string(v.shape) +
                ": same token count T");
  }
  if (key_mask) detail::check_key_mask(*key_mask, batch_, k.shape[2], "T");
  kernels::VQDecoderAppend da{};
  da.step =
      step_params({}, k, v, {batch_, heads_, 0, k.shape[2], d_, dv_}, key_mask, codebook_, codes_,
                  cb_heads_, static_cast<float>(scale_), static_cast<float>(options_.tau));
  const kernels::AttentionParams& p = da.step.base;
  da.prepared = prepared_.get();
  da.sums = s.sums;
  da.counts = s.counts;
  kernels::backend().vq_decoder_append(da);
  *s.position += p.nk;
}

void VQDecoder::query(const float* sums, const float* counts, TensorView q,
                      MutableTensorView out) const {
  detail::check_step(q, batch_, heads_, d_, "q", "D");
  detail::check_output(out, {batch_, heads_, q.shape[2], dv_}, "out", {q});
  kernels::VQDecoderQuery dq{};
  dq.step =
      step_params(q, {}, {}, {batch_, heads_, q.shape[2], 0, d_, dv_}, std::nullopt, codebook_,
                  codes_, cb_heads_, static_cast<float>(scale_), static_cast<float>(options_.tau));
  dq.step.base.out = out.data;
  dq.step.base.out_strides = out.strides;
  dq.sums = sums;
  dq.counts = counts;
  kernels::backend().vq_decoder_query(dq);
}

Tensor VQDecoder::query(TensorView q) const {
  detail::check_step(q, batch_, heads_, d_, "q", "D");
  Tensor out({batch_, heads_, q.shape[2], dv_});
  query(q, out.mutable_view());
  return out;
}

void VQDecoder::step(VQDecoderStateView s, TensorView q, TensorView k, TensorView v,
                     MutableTensorView out, const std::optional<KeyMaskView>& key_mask) {
  detail::check_decode_step(q, k, v, out, key_mask, batch_, heads_, d_, dv_);
  kernels::VQDecoderStep ds{};
  ds.step = step_params(q, k, v, {batch_, heads_, 1, 1, d_, dv_}, key_mask, codebook_, codes_,
                        cb_heads_, static_cast<float>(scale_), static_cast<float>(options_.tau));
  ds.step.base.out = out.data;
  ds.step.base.out_strides = out.strides;
  ds.prepared = prepared_.get();
  ds.sums = s.sums;
  ds.counts = s.counts;
  ds.workspace = &step_ws_;
  kernels::backend().vq_decoder_step(ds);
  *s.position += 1;
}

Tensor VQDecoder::step(TensorView q, TensorView k, TensorView v,
                       const std::optional<KeyMaskView>& key_mask) {
  detail::check_step(q, batch_, heads_, d_, "q", "D");
  Tensor out({batch_, heads_, 1, dv_});
  step(q, k, v, out.mutable_view(), key_mask);
  return out;
}

void VQDecoder::prefill(VQDecoderStateView s, TensorView q, TensorView k, TensorView v,
                        MutableTensorView out, const std::optional<KeyMaskView>& key_mask) {
  const int64_t T = detail::check_decode_prefill(q, k, v, out, key_mask, batch_, heads_, d_, dv_);
  // The causal kernel's state is [Vsum | n] per head (c x (dv + 1)); the decoder's holds the
  // sums and the counts apart: interleaved in, split out.
  const int64_t heads = batch_ * heads_, ld = dv_ + 1;
  if (prefill_ws_.size() < static_cast<size_t>(heads * codes_ * ld))
    prefill_ws_.resize(static_cast<size_t>(heads * codes_ * ld));
  for (int64_t r = 0; r < heads * codes_; ++r) {
    std::copy_n(s.sums + r * dv_, dv_, prefill_ws_.begin() + r * ld);
    prefill_ws_[static_cast<size_t>(r * ld + dv_)] = s.counts[r];
  }
  kernels::VQParams p =
      step_params(q, k, v, {batch_, heads_, T, T, d_, dv_}, key_mask, codebook_, codes_, cb_heads_,
                  static_cast<float>(scale_), static_cast<float>(options_.tau));
  p.block = kernels::backend().tuning().vq_block;
  p.base.out = out.data;
  p.base.out_strides = out.strides;
  p.init_states = prefill_ws_.data();
  p.final_states = prefill_ws_.data();
  kernels::backend().vq_causal(p);
  for (int64_t r = 0; r < heads * codes_; ++r) {
    std::copy_n(prefill_ws_.begin() + r * ld, dv_, s.sums + r * dv_);
    s.counts[r] = prefill_ws_[static_cast<size_t>(r * ld + dv_)];
  }
  *s.position += T;
}

Tensor VQDecoder::prefill(TensorView q, TensorView k, TensorView v,
                          const std::optional<KeyMaskView>& key_mask) {
  detail::check_step(q, batch_, heads_, d_, "q", "D");
  Tensor out({batch_, heads_, q.shape[2], dv_});
  prefill(q, k, v, out.mutable_view(), key_mask);
  return out;
}

}  // namespace favor
