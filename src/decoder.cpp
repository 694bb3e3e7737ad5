// Streaming decoding: per token and head, one projection (GEMV), one feature row, and a
// rank-1 update of S; a query is one projection, one feature row and a GEMV with S.
// Stabilisation follows the batch kernels token by token (cpu/feature_tile.hpp).
#include "favor/decoder.hpp"

#include <cmath>
#include <vector>

#include "core/validate.hpp"
#include "cpu/blas.hpp"
#include "cpu/feature_tile.hpp"
#include "cpu/head_state.hpp"
#include "cpu/vec_math.hpp"
#include "favor/error.hpp"

namespace favor {
namespace {

void check_step(const TensorView& t, int64_t batch, int64_t heads, int64_t dim,
                const std::string& name, const std::string& dim_name) {
  detail::check_view(t, name);
  if (t.shape[0] != batch || t.shape[1] != heads || t.shape[3] != dim) {
    throw Error(name + ": shape " + shape_string(t.shape) + " must be [B, H, T, " + dim_name +
                "] = [" + std::to_string(batch) + ',' + std::to_string(heads) + ",T," +
                std::to_string(dim) + ']');
  }
  detail::check_finite(t, name);
}

}  // namespace

Decoder::Decoder(int64_t batch, int64_t heads, int64_t dv, Projection w,
                 const DecoderOptions& options)
    : batch_(batch), heads_(heads), dv_(dv), features_(0), w_(std::move(w)), options_(options) {
  if (batch < 1) throw Error("batch: " + std::to_string(batch) + " must be >= 1");
  if (heads < 1) throw Error("heads: " + std::to_string(heads) + " must be >= 1");
  if (dv < 1) throw Error("dv: " + std::to_string(dv) + " must be >= 1");
  sqrt_scale_ = std::sqrt(detail::resolve_scale(options.scale, w_.d()));
  features_ = feature_count(options.kernel, w_.m());
  S_.assign(static_cast<size_t>(batch * heads * features_ * dv), 0.0f);
  s_.assign(static_cast<size_t>(batch * heads * features_), 0.0f);
  max_.assign(static_cast<size_t>(batch * heads), -INFINITY);
}

void Decoder::reset() {
  std::fill(S_.begin(), S_.end(), 0.0f);
  std::fill(s_.begin(), s_.end(), 0.0f);
  std::fill(max_.begin(), max_.end(), -INFINITY);
  position_ = 0;
}

void Decoder::append(TensorView k, TensorView v) {
  check_step(k, batch_, heads_, w_.d(), "k", "D");
  check_step(v, batch_, heads_, dv_, "v", "Dv");
  if (k.shape[2] != v.shape[2]) {
    throw Error("k " + shape_string(k.shape) + ", v " + shape_string(v.shape) +
                ": same token count T");
  }
  const int64_t m = w_.m(), d = w_.d(), F = features_;
  std::vector<float> x(d), a(m), phi(F), vrow(dv_);
  const float one = 1.0f;
  for (int64_t t = 0; t < k.shape[2]; ++t)
    for (int64_t b = 0; b < batch_; ++b)
      for (int64_t h = 0; h < heads_; ++h) {
        const size_t bh = static_cast<size_t>(b * heads_ + h);
        cpu::HeadState state{S_.data() + bh * F * dv_, s_.data() + bh * F, F, dv_, max_[bh]};
        double half_norm2 = 0.0;
        cpu::gather_rows(&k.at(b, h, t, 0), 0, k.strides[3], 1, d, static_cast<float>(sqrt_scale_),
                         x.data(), &half_norm2);
        cpu::gather_rows(&v.at(b, h, t, 0), 0, v.strides[3], 1, dv_, 1.0f, vrow.data(), nullptr);
        cpu::gemv(false, m, d, 1.0f, w_.data(), d, x.data(), 0.0f, a.data());
        const double g = cpu::key_log_weight(options_.kernel, half_norm2);
        const double row_max = cpu::key_log_max(options_.kernel, a.data(), m, g);
        if (row_max > state.max) state.raise_max(row_max);
        cpu::key_features(options_.kernel, a.data(), m, g - state.max, phi.data());
        state.accumulate(phi.data(), vrow.data(), 1, &one);
        max_[bh] = state.max;
      }
  position_ += k.shape[2];
}

void Decoder::query(TensorView q, MutableTensorView out) const {
  check_step(q, batch_, heads_, w_.d(), "q", "D");
  detail::check_output(out, {batch_, heads_, q.shape[2], dv_}, "out", {q});
  const int64_t m = w_.m(), d = w_.d(), F = features_;
  std::vector<float> x(d), a(m), phi(F), log_s(F), y(dv_);
  for (int64_t b = 0; b < batch_; ++b)
    for (int64_t h = 0; h < heads_; ++h) {
      const size_t bh = static_cast<size_t>(b * heads_ + h);
      const float* S = S_.data() + bh * F * dv_;
      const float* s = s_.data() + bh * F;
      if (cpu::positive_family(options_.kernel)) cpu::log_or_neg_inf(s, log_s.data(), F);
      for (int64_t t = 0; t < q.shape[2]; ++t) {
        cpu::gather_rows(&q.at(b, h, t, 0), 0, q.strides[3], 1, d, static_cast<float>(sqrt_scale_),
                         x.data(), nullptr);
        cpu::gemv(false, m, d, 1.0f, w_.data(), d, x.data(), 0.0f, a.data());
        const float c = cpu::query_shift(options_.kernel, a.data(), m, log_s.data());
        float den = 0.0f;
        if (!std::isinf(c)) {  // -inf: nothing appended for this head yet
          cpu::query_features(options_.kernel, a.data(), m, c, log_s.data(), phi.data());
          cpu::gemv(true, F, dv_, 1.0f, S, dv_, phi.data(), 0.0f, y.data());
          for (int64_t f = 0; f < F; ++f) den += phi[f] * s[f];
        }
        cpu::write_rows(y.data(), &den, 1, dv_, &out.at(b, h, t, 0), 0, out.strides[3]);
      }
    }
}

Tensor Decoder::query(TensorView q) const {
  check_step(q, batch_, heads_, w_.d(), "q", "D");
  Tensor out({batch_, heads_, q.shape[2], dv_});
  query(q, out.mutable_view());
  return out;
}

}  // namespace favor
