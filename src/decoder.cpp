// Streaming decoding. One token per head costs a projection (m dot products), one feature
// row, a rank-1 update of S and an axpy into s; a query costs a projection, one feature
// row, S^T phi and a dot with s: O(F (D + Dv)) whatever the position, all in SIMD lanes
// (cpu/vec_math.hpp), with heads spread over threads. Appending T > 1 tokens (prefill)
// goes through the tiled key pass of the batch kernels (GEMMs). Stabilisation follows the
// batch kernels (cpu/feature_tile.hpp): keys against the running max, queries shifted by
// max_f (L_f + log s_f).
#include "favor/decoder.hpp"

#include <omp.h>

#include <cmath>
#include <vector>

#include "core/feature_map_params.hpp"
#include "core/validate.hpp"
#include "cpu/blas.hpp"
#include "cpu/feature_tile.hpp"
#include "cpu/head_state.hpp"
#include "cpu/key_state.hpp"
#include "cpu/schedule.hpp"
#include "cpu/vec_math.hpp"
#include "favor/error.hpp"
#include "favor/runtime.hpp"

namespace favor {
namespace {

// Per-thread buffers of the token path.
struct TokenBuffers {
  std::vector<float> x, a, phi, vx, s, log_s, yx;
  TokenBuffers(int64_t d, int64_t m, int64_t F, int64_t dv)
      : x(d), a(m), phi(F), vx(dv + 1), s(F), log_s(F), yx(dv + 1) {}
};

// The tokens of one head that take part in a masked prefill, gathered contiguous: the key
// pass then runs over them exactly as over an unpadded input (same tiles, same positions).
struct KeptTokens {
  std::vector<float> k, v;
  KeptTokens(int64_t T, int64_t d, int64_t dv) : k(T * d), v(T * dv) {}

  // Params of an input with batch and head strides 0 holding the tokens j of head (b, h) with
  // keep(j), in order.
  template <class Keep>
  kernels::AttentionParams gather(const kernels::AttentionParams& p, int64_t b, int64_t h,
                                  Keep keep) {
    const float* kh = p.k + b * p.k_strides[0] + h * p.k_strides[1];
    const float* vh = p.v + b * p.v_strides[0] + h * p.v_strides[1];
    int64_t n = 0;
    for (int64_t j = 0; j < p.nk; ++j) {
      if (!keep(j)) continue;
      for (int64_t x = 0; x < p.d; ++x)
        k[n * p.d + x] = kh[j * p.k_strides[2] + x * p.k_strides[3]];
      for (int64_t x = 0; x < p.dv; ++x)
        v[n * p.dv + x] = vh[j * p.v_strides[2] + x * p.v_strides[3]];
      ++n;
    }
    kernels::AttentionParams one = p;
    one.k = k.data();
    one.k_strides = {0, 0, p.d, 1};
    one.v = v.data();
    one.v_strides = {0, 0, p.dv, 1};
    one.nk = n;
    return one;
  }
};

// a = W x from W^T (d x m, row-major): a = sum_t x_t W^T[t, :], whole SIMD rows, no
// horizontal sums.
void project(const float* wt, const float* bias, int64_t d, int64_t m, const float* x, float* a) {
  cpu::transposed_matvec(wt, x, d, m, a);
  if (bias) {
    for (int64_t f = 0; f < m; ++f) a[f] += bias[f];
  }
}

}  // namespace

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
  S_.assign(static_cast<size_t>(batch * heads * features_ * (dv + 1)), 0.0f);
  max_.assign(static_cast<size_t>(batch * heads), -INFINITY);
  row_pos_.assign(static_cast<size_t>(batch), 0);
}

void Decoder::reset() {
  std::fill(S_.begin(), S_.end(), 0.0f);
  std::fill(max_.begin(), max_.end(), -INFINITY);
  std::fill(row_pos_.begin(), row_pos_.end(), 0);
  position_ = 0;
}

void Decoder::append(TensorView k, TensorView v, const std::optional<KeyMaskView>& key_mask) {
  detail::check_step(k, batch_, heads_, w_.d(), "k", "D");
  detail::check_step(v, batch_, heads_, dv_, "v", "Dv");
  if (k.shape[2] != v.shape[2]) {
    throw Error("k " + shape_string(k.shape) + ", v " + shape_string(v.shape) +
                ": same token count T");
  }
  if (key_mask) detail::check_key_mask(*key_mask, batch_, k.shape[2], "T");
  const int64_t m = w_.m(), d = w_.d(), F = features_, T = k.shape[2], heads = batch_ * heads_;
  const int threads =
      cpu::threads_for(heads, double(T) * (2.0 * d * m + 2.0 * F * dv_), num_threads());
  // Buffers are allocated before the parallel region (allocation failures throw here).
  std::vector<TokenBuffers> buffers;
  std::vector<cpu::KeyTile> tiles;
  std::vector<KeptTokens> kept;
  for (int t = 0; t < threads; ++t) {
    if (T == 1 || key_mask) buffers.emplace_back(d, m, F, dv_);
    if (T > 1) tiles.emplace_back(d, m, F, dv_);
    if (T > 1 && key_mask) kept.emplace_back(T, d, dv_);
  }
  kernels::AttentionParams p{};
  p.k = k.data;
  p.k_strides = k.strides;
  p.v = v.data;
  p.v_strides = v.strides;
  p.batch = batch_;
  p.heads = heads_;
  p.nk = T;
  p.d = d;
  p.dv = dv_;
  p.map = map_->params();
  const kernels::FeatureParams& fp = p.map;
  auto head_wt = [&](int64_t bh) { return wt_.data() + (bh % fp.w_sets) * d * m; };
  auto takes_part = [&](int64_t b, int64_t j) { return !key_mask || key_mask->at(b, j); };
#pragma omp parallel num_threads(threads)
  {
    cpu::blas_on_calling_thread();
    const auto tid = static_cast<size_t>(omp_get_thread_num());
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < heads; ++bh) {
      const int64_t b = bh / heads_, h = bh % heads_;
      cpu::HeadState state{S_.data() + bh * F * (dv_ + 1), F, dv_, max_[bh]};
      const int64_t row_pos = row_pos_[static_cast<size_t>(b)];
      // One token: a projection, one feature row and a rank-1 update of [S | s].
      auto add_token = [&](const float* kj, int64_t k_stride, const float* vj, int64_t v_stride) {
        TokenBuffers& buf = buffers[tid];
        double half_norm2 = 0.0;  // |y|^2 / 2 accumulated in double, as in the batch kernels
        cpu::gather_rows(kj, 0, k_stride, 1, d, fp.sqrt_scale, buf.x.data(), &half_norm2);
        cpu::gather_values(vj, 0, v_stride, 1, dv_, buf.vx.data());
        project(head_wt(bh), fp.head_bias(bh), d, m, buf.x.data(), buf.a.data());
        const double g = fp.key_log_weight(half_norm2, bh, row_pos);
        const double row_max = cpu::key_log_max(fp, bh, buf.a.data(), g);
        if (row_max > state.max) state.raise_max(row_max);
        cpu::key_features(fp, bh, buf.a.data(), g - state.max, buf.phi.data());
        cpu::rank1_update(state.Sx, buf.phi.data(), buf.vx.data(), F,
                          dv_ + 1);  // [S | s] += phi [v | 1]
      };
      if (T == 1) {
        if (takes_part(b, 0))
          add_token(&k.at(b, h, 0, 0), k.strides[3], &v.at(b, h, 0, 0), v.strides[3]);
      } else if (!key_mask) {  // prefill: the tiled key pass
        kernels::AttentionParams ph = p;
        ph.first_position = row_pos;
        cpu::accumulate_keys(ph, b, h, 0, T, tiles[tid], state);
      } else {  // masked prefill: the kept tokens, as an unmasked append of them would
        KeptTokens& kt = kept[tid];
        kernels::AttentionParams ph =
            kt.gather(p, b, h, [&](int64_t j) { return takes_part(b, j); });
        ph.first_position = row_pos;
        if (ph.nk == 1) {
          add_token(kt.k.data(), 1, kt.v.data(), 1);
        } else if (ph.nk > 1) {  // batch and head strides 0: (b, h) picks the map parameters
          cpu::accumulate_keys(ph, b, h, 0, ph.nk, tiles[tid], state);
        }
      }
      max_[bh] = state.max;
    }
  }
  for (int64_t b = 0; b < batch_; ++b)
    for (int64_t j = 0; j < T; ++j) row_pos_[static_cast<size_t>(b)] += takes_part(b, j) ? 1 : 0;
  position_ += T;
}

void Decoder::query(TensorView q, MutableTensorView out) const {
  detail::check_step(q, batch_, heads_, w_.d(), "q", "D");
  detail::check_output(out, {batch_, heads_, q.shape[2], dv_}, "out", {q});
  const int64_t m = w_.m(), d = w_.d(), F = features_, T = q.shape[2], heads = batch_ * heads_;
  const int threads =
      cpu::threads_for(heads, double(T) * (2.0 * d * m + 2.0 * F * dv_), num_threads());
  std::vector<TokenBuffers> buffers;
  for (int t = 0; t < threads; ++t) buffers.emplace_back(d, m, F, dv_);
  const kernels::FeatureParams fp = map_->params();
  auto head_wt = [&](int64_t bh) { return wt_.data() + (bh % fp.w_sets) * d * m; };
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t bh = 0; bh < heads; ++bh) {
    const int64_t b = bh / heads_, h = bh % heads_;
    TokenBuffers& buf = buffers[static_cast<size_t>(omp_get_thread_num())];
    const float* Sx = S_.data() + bh * F * (dv_ + 1);  // [S | s]
    if (cpu::positive_family(fp.kernel)) {
      for (int64_t f = 0; f < F; ++f) buf.s[f] = Sx[f * (dv_ + 1) + dv_];
      cpu::log_or_neg_inf(buf.s.data(), buf.log_s.data(), F);
    }
    for (int64_t t = 0; t < T; ++t) {
      cpu::gather_rows(&q.at(b, h, t, 0), 0, q.strides[3], 1, d, fp.sqrt_scale, buf.x.data(),
                       nullptr);
      project(head_wt(bh), fp.head_bias(bh), d, m, buf.x.data(), buf.a.data());
      const float c = cpu::query_shift(fp.kernel, buf.a.data(), m, buf.log_s.data());
      if (std::isinf(c)) {  // -inf: nothing appended for this head yet; den 0 gives zeros
        std::fill(buf.yx.begin(), buf.yx.end(), 0.0f);
      } else {
        cpu::query_features(fp.kernel, buf.a.data(), m, c, buf.log_s.data(), buf.phi.data());
        cpu::transposed_matvec(Sx, buf.phi.data(), F, dv_ + 1, buf.yx.data());  // [y | den]
      }
      cpu::write_rows(buf.yx.data(), 1, dv_, &out.at(b, h, t, 0), 0, out.strides[3]);
    }
  }
}

Tensor Decoder::query(TensorView q) const {
  detail::check_step(q, batch_, heads_, w_.d(), "q", "D");
  Tensor out({batch_, heads_, q.shape[2], dv_});
  query(q, out.mutable_view());
  return out;
}

}  // namespace favor
