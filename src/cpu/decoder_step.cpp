// The streaming decoder's steps on the CPU (kernels/decoder_params.hpp). One token per head
// costs a projection (m dot products), one feature row, a rank-1 update of S and an axpy
// into s; a query costs a projection, one feature row, S^T phi and a dot with s:
// O(F (D + Dv)) whatever the position, all in SIMD lanes (cpu/vec_math.hpp), with heads
// spread over threads. Appending T > 1 tokens (prefill) goes through the tiled key pass of
// the batch kernels (GEMMs). Stabilisation follows the batch kernels (cpu/feature_tile.hpp):
// keys against the running max, queries shifted by max_f (L_f + log s_f).
#include "cpu/decoder_step.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/blas.hpp"
#include "cpu/feature_tile.hpp"
#include "cpu/head_state.hpp"
#include "cpu/key_state.hpp"
#include "cpu/schedule.hpp"
#include "cpu/vec_math.hpp"

namespace favor::cpu {
namespace {

// Row t of head (b, h) of the step's keys, values, queries and outputs.
const float* key_row(const AttentionParams& p, int64_t b, int64_t h, int64_t t) {
  return p.k + b * p.k_strides[0] + h * p.k_strides[1] + t * p.k_strides[2];
}
const float* value_row(const AttentionParams& p, int64_t b, int64_t h, int64_t t) {
  return p.v + b * p.v_strides[0] + h * p.v_strides[1] + t * p.v_strides[2];
}
const float* query_row(const AttentionParams& p, int64_t b, int64_t h, int64_t t) {
  return p.q + b * p.q_strides[0] + h * p.q_strides[1] + t * p.q_strides[2];
}
float* output_row(const AttentionParams& p, int64_t b, int64_t h, int64_t t) {
  return p.out + b * p.out_strides[0] + h * p.out_strides[1] + t * p.out_strides[2];
}

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
  AttentionParams gather(const AttentionParams& p, int64_t b, int64_t h, Keep keep) {
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
    AttentionParams one = p;
    one.k = k.data();
    one.k_strides = {0, 0, p.d, 1};
    one.v = v.data();
    one.v_strides = {0, 0, p.dv, 1};
    one.nk = n;
    one.mask = nullptr;  // every gathered token takes part
    return one;
  }
};

// a = W x from W^T (d x m, row-major): a = sum_t x_t W^T[t, :], whole SIMD rows, no
// horizontal sums.
void project(const float* wt, const float* bias, int64_t d, int64_t m, const float* x, float* a) {
  transposed_matvec(wt, x, d, m, a);
  if (bias) {
    for (int64_t f = 0; f < m; ++f) a[f] += bias[f];
  }
}

}  // namespace

void decoder_append(const DecoderAppend& da, const Config& config) {
  const AttentionParams& p = da.step;
  const FeatureParams& fp = p.map;
  const int64_t m = fp.m, d = p.d, dv = p.dv, F = fp.features(), T = p.nk,
                heads = p.batch * p.heads;
  const bool masked = p.mask != nullptr;
  const int threads = threads_for(heads, double(T) * (2.0 * d * m + 2.0 * F * dv), config.threads);
  // Buffers are allocated before the parallel region.
  std::vector<TokenBuffers> buffers;
  std::vector<KeyTile> tiles;
  std::vector<KeptTokens> kept;
  for (int t = 0; t < threads; ++t) {
    if (T == 1 || masked) buffers.emplace_back(d, m, F, dv);
    if (T > 1) tiles.emplace_back(d, m, F, dv);
    if (T > 1 && masked) kept.emplace_back(T, d, dv);
  }
  auto head_wt = [&](int64_t bh) { return da.wt + (bh % fp.w_sets) * d * m; };
  auto takes_part = [&](int64_t b, int64_t j) {
    return !masked || p.mask[b * p.mask_stride_b + j * p.mask_stride_n] != 0;
  };
  const int team = team_now(
      threads, double(heads) * double(T) *
                   (2.0 * d * m + 2.0 * F * dv));  // one thread while contended (cpu/team.hpp)
  RegionClock clock(team);
#pragma omp parallel num_threads(team)
  {
    const int64_t arrived = clock.arrive();
    blas_on_calling_thread();
    const auto tid = static_cast<size_t>(omp_get_thread_num());
#pragma omp for schedule(static) nowait
    for (int64_t bh = 0; bh < heads; ++bh) {
      const int64_t b = bh / p.heads, h = bh % p.heads;
      HeadState state{da.sums + bh * F * (dv + 1), F, dv, da.log_max[bh]};
      const int64_t row_pos = da.row_positions[b];
      // One token: a projection, one feature row and a rank-1 update of [S | s].
      auto add_token = [&](const float* kj, int64_t k_stride, const float* vj, int64_t v_stride,
                           int64_t position) {
        TokenBuffers& buf = buffers[tid];
        double half_norm2 = 0.0;  // |y|^2 / 2 accumulated in double, as in the batch kernels
        gather_rows(kj, 0, k_stride, 1, d, fp.sqrt_scale, buf.x.data(), &half_norm2);
        gather_values(vj, 0, v_stride, 1, dv, buf.vx.data());
        project(head_wt(bh), fp.head_bias(bh), d, m, buf.x.data(), buf.a.data());
        const double g = fp.key_log_weight(half_norm2, bh, position);
        const double row_max = key_log_max(fp, bh, buf.a.data(), g);
        if (row_max > state.max) state.raise_max(row_max);
        key_features(fp, bh, buf.a.data(), g - state.max, buf.phi.data());
        rank1_update(state.Sx, buf.phi.data(), buf.vx.data(), F,
                     dv + 1);  // [S | s] += phi [v | 1]
      };
      // With decay, whether the row's kept tokens take consecutive clocks from row_pos (no
      // masked token ticks the clock between them: kernels::clock_ticks); if not, they go
      // one by one, each at its clock.
      bool consecutive = true;
      if (masked && fp.decay_rate) {
        int64_t clock = row_pos, kept_before = 0;
        for (int64_t j = 0; j < T; ++j) {
          const bool keep = takes_part(b, j);
          if (keep && clock != row_pos + kept_before) consecutive = false;
          kept_before += keep ? 1 : 0;
          clock += kernels::clock_ticks(keep, clock) ? 1 : 0;
        }
      }
      if (T == 1) {
        if (takes_part(b, 0))
          add_token(key_row(p, b, h, 0), p.k_strides[3], value_row(p, b, h, 0), p.v_strides[3],
                    row_pos);
      } else if (!masked) {  // prefill: the tiled key pass
        kernels::AttentionParams ph = p;
        ph.first_position = row_pos;
        accumulate_keys(ph, b, h, 0, T, tiles[tid], state);
      } else if (!consecutive) {  // decay and a masked token that ticks: token by token
        int64_t clock = row_pos;
        for (int64_t j = 0; j < T; ++j) {
          const bool keep = takes_part(b, j);
          if (keep)
            add_token(key_row(p, b, h, j), p.k_strides[3], value_row(p, b, h, j), p.v_strides[3],
                      clock);
          clock += kernels::clock_ticks(keep, clock) ? 1 : 0;
        }
      } else {  // masked prefill: the kept tokens, as an unmasked append of them would
        KeptTokens& kt = kept[tid];
        kernels::AttentionParams ph =
            kt.gather(p, b, h, [&](int64_t j) { return takes_part(b, j); });
        ph.first_position = row_pos;
        if (ph.nk == 1) {
          add_token(kt.k.data(), 1, kt.v.data(), 1, row_pos);
        } else if (ph.nk > 1) {  // batch and head strides 0: (b, h) picks the map parameters
          accumulate_keys(ph, b, h, 0, ph.nk, tiles[tid], state);
        }
      }
      da.log_max[bh] = state.max;
    }
    clock.done(arrived);
  }
}

void decoder_query(const DecoderQuery& dq, const Config& config) {
  const AttentionParams& p = dq.step;
  const FeatureParams fp = p.map;
  const int64_t m = fp.m, d = p.d, dv = p.dv, F = fp.features(), T = p.nq,
                heads = p.batch * p.heads;
  const int threads = threads_for(heads, double(T) * (2.0 * d * m + 2.0 * F * dv), config.threads);
  std::vector<TokenBuffers> buffers;
  for (int t = 0; t < threads; ++t) buffers.emplace_back(d, m, F, dv);
  auto head_wt = [&](int64_t bh) { return dq.wt + (bh % fp.w_sets) * d * m; };
  const int team = team_now(threads, double(heads) * double(T) * (2.0 * d * m + 2.0 * F * dv));
  RegionClock clock(team);
#pragma omp parallel num_threads(team)
  {
    const int64_t arrived = clock.arrive();
#pragma omp for schedule(static) nowait
    for (int64_t bh = 0; bh < heads; ++bh) {
      const int64_t b = bh / p.heads, h = bh % p.heads;
      TokenBuffers& buf = buffers[static_cast<size_t>(omp_get_thread_num())];
      const float* Sx = dq.sums + bh * F * (dv + 1);  // [S | s]
      if (positive_family(fp.kernel)) {
        for (int64_t f = 0; f < F; ++f) buf.s[f] = Sx[f * (dv + 1) + dv];
        log_or_neg_inf(buf.s.data(), buf.log_s.data(), F);
      }
      for (int64_t t = 0; t < T; ++t) {
        gather_rows(query_row(p, b, h, t), 0, p.q_strides[3], 1, d, fp.sqrt_scale, buf.x.data(),
                    nullptr);
        project(head_wt(bh), fp.head_bias(bh), d, m, buf.x.data(), buf.a.data());
        const float c = query_shift(fp.kernel, buf.a.data(), m, buf.log_s.data());
        if (std::isinf(c)) {  // -inf: nothing appended for this head yet; den 0 gives zeros
          std::fill(buf.yx.begin(), buf.yx.end(), 0.0f);
        } else {
          query_features(fp.kernel, buf.a.data(), m, c, buf.log_s.data(), buf.phi.data());
          transposed_matvec(Sx, buf.phi.data(), F, dv + 1, buf.yx.data());  // [y | den]
        }
        if (dq.part_rows) {  // a hybrid decoder's linear part: the row and its log scale
          std::copy(buf.yx.begin(), buf.yx.end(), dq.part_rows + (bh * T + t) * (dv + 1));
          const double lm = dq.log_max[bh];
          dq.part_shift[bh * T + t] = std::isinf(c) || std::isinf(lm) ? -INFINITY : c + lm;
        }
        if (p.out) write_rows(buf.yx.data(), 1, dv, output_row(p, b, h, t), 0, p.out_strides[3]);
      }
    }
    clock.done(arrived);
  }
}

}  // namespace favor::cpu
