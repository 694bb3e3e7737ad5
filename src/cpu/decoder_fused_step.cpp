// The streaming decoder's fused step on the CPU (kernels/decoder_params.hpp, DecoderStep):
// append one token per (batch, head) and query the state after it, for B rows x H heads.
//
// 1. Projections: the step's key and query rows of a run of heads that share a parameter
//    set go through one GEMM ([2 heads x d] x [d x m]; with shared projections, w_sets = 1,
//    each thread's heads are one run), from the decoder's W^T: on OpenBLAS's small-matrix
//    path (project_rows_transposed), or, up to kStepRegisterRows rows in the whole step with
//    a BLAS kernel that has no such path, favor's register-blocked product (small_gemm).
// 2. Per head, one pass over [S | s]: the key's features against the running max (raised
//    first if the key exceeds it, docs/numerics.md), s updated first (the query's shift
//    c = max_f (L_f + log s_f) needs the new s), then for each feature row f
//    S_f += phi_k[f] [v | 1] and [y | den] += phi_q[f] S_f in the same sweep
//    (vec_math update_and_read): S is read and written once.
// Everything after the projection is the same float operations, in the same order, as
// decoder_append then decoder_query (cpu/decoder_step.cpp); only the projection's sums
// (GEMM instead of a matvec per row) round differently.
// 3. A hybrid decoder's step (ds.band set): the key is the token leaving the window (if
//    any, read from its ring slot), the entering token then takes that slot (ds.enter_k),
//    and the query's [y | den] with its log scale is merged with the exact part over the
//    ring and the sinks (band_decode_row, the merge of the batch kernel) in the same pass:
//    one parallel region per step, as the plain decoder's, and no copy of a row outside it.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "cpu/attention_params.hpp"
#include "cpu/band_attention.hpp"
#include "cpu/blas.hpp"
#include "cpu/decoder_step.hpp"
#include "cpu/feature_tile.hpp"
#include "cpu/head_state.hpp"
#include "cpu/isa_cap.hpp"
#include "cpu/schedule.hpp"
#include "cpu/small_gemm.hpp"
#include "cpu/vec_math.hpp"

namespace favor::cpu {
namespace {

// A step's flops from which its heads go over threads. Measured (p10 of 3000 single steps,
// one sequence, D = 64, H = 2..8, m = 32..256, 2 cores): two threads cost 1.2-2.7x one
// thread up to ~260k flops and broke even at ~0.5-1 MFLOP (one sequence of 8 heads at
// m = 256 is 1.06 MFLOP: 58-62k tokens/s on two free cores against ~40k on one).
constexpr double kStepThreadsFrom = 4e5;

// Rows (2 per head: key and query) of a whole step up to which its projections go through
// small_gemm instead of OpenBLAS, where OpenBLAS would pack W on every call: its Haswell
// and Zen kernels (AVX2 machines) do; its SkylakeX-family kernels (AVX-512) have a
// small-matrix path that does not, and keep the step (docs/performance.md, "Batched decode":
// 40.0k -> 47.2k tokens/s there; small_gemm has not been timed on AVX-512). Measured (Zen 3, AVX2,
// one step of B sequences x 8 heads, D = 64, m = 256, 2 threads, medians of 5 interleaved
// runs of 3840 steps, tokens/s OpenBLAS -> small_gemm): B = 1 (16 rows) 16.1k -> 21.0k,
// B = 2 (32) 26.9k -> 30.0k, B = 4 (64) 25.9k -> 25.4k, B = 8 (128) 29.0k -> 26.1k. Decided by
// the step's rows, not a thread's run, so that a head's bits do not depend on the threads.
constexpr int64_t kStepRegisterRows = 32;

bool blas_packs_small_products() {
  static const bool packs = openblas_core_level(blas_core()) != 4;
  return packs;
}

// The step's buffers, carved out of the decoder's workspace: rows 2 i (key) and 2 i + 1
// (query) of x and a belong to the head at place i of the set-major order; then, per
// thread, the feature rows and [v | 1], [y | den].
struct StepBuffers {
  float *x, *a, *per_thread;
  double* half_norm2;
  int64_t per_thread_floats;
};

// The head at place i of the set-major order (place (bh % sets) * (heads / sets) + bh / sets):
// the heads of one parameter set are contiguous.
int64_t head_at(int64_t place, int64_t heads, int64_t sets) {
  const int64_t per_set = heads / sets;
  return (place % per_set) * sets + place / per_set;
}

}  // namespace

void decoder_step(const DecoderStep& ds, const Config& config) {
  const AttentionParams& p = ds.step;
  const FeatureParams& fp = p.map;
  const int64_t m = fp.m, d = p.d, dv = p.dv, ld = dv + 1, F = fp.features(),
                heads = p.batch * p.heads, sets = fp.w_sets;
  const double exact_flops =
      ds.band ? 2.0 * double(ds.band->window + ds.band->sinks) * double(d + ld) : 0.0;
  const double head_flops = 4.0 * double(d * m) + 4.0 * double(F * ld) + exact_flops;
  const int threads = threads_for(heads, head_flops, config.threads, kStepThreadsFrom);
  const int64_t per_thread = 4 * F + 2 * ld + (ds.band ? band_decode_floats(*ds.band) : 0);
  const auto floats = static_cast<size_t>(2 * heads * (d + m) + threads * per_thread);
  if (ds.workspace->size() < floats) ds.workspace->resize(floats);
  if (ds.workspace_d->size() < static_cast<size_t>(heads))
    ds.workspace_d->resize(static_cast<size_t>(heads));
  StepBuffers buf{ds.workspace->data(), ds.workspace->data() + 2 * heads * d,
                  ds.workspace->data() + 2 * heads * (d + m), ds.workspace_d->data(), per_thread};
  auto takes_part = [&](int64_t b) {  // no key: a hybrid step with none leaving the window
    return p.k != nullptr && (p.mask == nullptr || p.mask[b * p.mask_stride_b] != 0);
  };
  // The heads are split into `threads` runs (each projected by its own GEMMs) whatever team
  // runs them (cpu/team.hpp: one thread while the machine is contended), so a head's bits do
  // not depend on the team.
  const int team_size = team_now(threads, double(heads) * head_flops);
  RegionClock clock(team_size);
#pragma omp parallel num_threads(team_size)
  {
    const int64_t arrived = clock.arrive();
    blas_on_calling_thread();
    const int tid = omp_get_thread_num(), team = omp_get_num_threads();
    for (int run = tid; run < threads; run += team) {
      const int64_t first = heads * run / threads, last = heads * (run + 1) / threads;
      // Gather the scaled key and query rows of this thread's heads.
      for (int64_t i = first; i < last; ++i) {
        const int64_t bh = head_at(i, heads, sets), b = bh / p.heads, h = bh % p.heads;
        if (p.k) {
          gather_rows(p.k + b * p.k_strides[0] + h * p.k_strides[1], 0, p.k_strides[3], 1, d,
                      fp.sqrt_scale, buf.x + 2 * i * d, &buf.half_norm2[bh]);
        } else {  // projected, never read
          std::fill(buf.x + 2 * i * d, buf.x + (2 * i + 1) * d, 0.0f);
          buf.half_norm2[bh] = 0.0;
        }
        gather_rows(p.q + b * p.q_strides[0] + h * p.q_strides[1], 0, p.q_strides[3], 1, d,
                    fp.sqrt_scale, buf.x + (2 * i + 1) * d, nullptr);
      }
      // One GEMM per run of heads sharing a projection; the log bias per head after it.
      for (int64_t i = first; i < last;) {
        const int64_t set = head_at(i, heads, sets) % sets;
        int64_t end = i + 1;
        while (end < last && head_at(end, heads, sets) % sets == set) ++end;
        if (2 * heads <= kStepRegisterRows && blas_packs_small_products())
          small_gemm(false, 2 * (end - i), m, d, 1.0f, buf.x + 2 * i * d, d, ds.wt + set * d * m, m,
                     0.0f, buf.a + 2 * i * m, m);
        else
          project_rows_transposed(buf.x + 2 * i * d, 2 * (end - i), d, ds.wt + set * d * m, m,
                                  buf.a + 2 * i * m);
        i = end;
      }
      if (fp.bias) {
        for (int64_t i = first; i < last; ++i) {
          const float* bias = fp.head_bias(head_at(i, heads, sets));
          float* a = buf.a + 2 * i * m;
          for (int64_t f = 0; f < m; ++f) {
            a[f] += bias[f];
            a[m + f] += bias[f];
          }
        }
      }
      float* phik = buf.per_thread + tid * buf.per_thread_floats;
      float *phiq = phik + F, *s = phiq + F, *log_s = s + F, *vx = log_s + F, *yx = vx + ld,
            *exact = yx + ld;
      std::fill(log_s, log_s + F, 0.0f);  // trig reads no log_s
      for (int64_t i = first; i < last; ++i) {
        const int64_t bh = head_at(i, heads, sets), b = bh / p.heads, h = bh % p.heads;
        const float *ak = buf.a + 2 * i * m, *aq = ak + m;
        HeadState state{ds.sums + bh * F * ld, F, dv, ds.log_max[bh]};
        const bool keep = takes_part(b);
        if (keep) {
          const double g = fp.key_log_weight(buf.half_norm2[bh], bh, ds.row_positions[b]);
          const double row_max = key_log_max(fp, bh, ak, g);
          if (row_max > state.max) state.raise_max(row_max);
          key_features(fp, bh, ak, g - state.max, phik);
          gather_values(p.v + b * p.v_strides[0] + h * p.v_strides[1], 0, p.v_strides[3], 1, dv,
                        vx);
        }
        if (positive_family(fp.kernel)) {  // s after the key: the query's shift needs it
          for (int64_t f = 0; f < F; ++f) {
            s[f] = state.Sx[f * ld + dv];
            if (keep) s[f] += phik[f] * vx[dv];  // as the update will: s_f + phi_f * 1
          }
          log_or_neg_inf(s, log_s, F);
        }
        const float c = query_shift(fp.kernel, aq, m, log_s);
        if (std::isinf(c)) {  // no key in this head yet (and none added): zeros
          if (keep) rank1_update(state.Sx, phik, vx, F, ld);
          std::fill(yx, yx + ld, 0.0f);
        } else {
          query_features(fp.kernel, aq, m, c, log_s, phiq);
          if (keep) {
            update_and_read(state.Sx, phik, vx, phiq, F, ld, yx);
          } else {
            transposed_matvec(state.Sx, phiq, F, ld, yx);
          }
        }
        if (ds.enter_k) {  // the entering token takes the slot the leaving one was read from
          const int64_t window = ds.band->window, o = bh * window + ds.enter_slot;
          const float* kr = ds.enter_k + b * ds.enter_k_strides[0] + h * ds.enter_k_strides[1];
          const float* vr = ds.enter_v + b * ds.enter_v_strides[0] + h * ds.enter_v_strides[1];
          gather_rows(kr, 0, ds.enter_k_strides[3], 1, d, 1.0f, ds.ring_k_out + o * d, nullptr);
          gather_rows(vr, 0, ds.enter_v_strides[3], 1, dv, 1.0f, ds.ring_v_out + o * dv, nullptr);
        }
        if (ds.band) {  // the merge with the exact part: c + log_max + the query's weight
          double shift = -INFINITY;
          if (!std::isinf(c) && !std::isinf(state.max)) {
            const float* qr = p.q + b * p.q_strides[0] + h * p.q_strides[1];
            const int64_t before = ds.row_positions[b];  // the clock after the step, less 1
            const int64_t clock = before + (kernels::clock_ticks(keep, before) ? 1 : 0) - 1;
            shift = (double(c) + state.max) +
                    ds.weight.at(fp, bh, kernels::squared_norm(qr, d, p.q_strides[3]), clock);
          }
          band_decode_row(*ds.band, bh, 0, yx, shift, exact);
        } else {
          write_rows(yx, 1, dv, p.out + b * p.out_strides[0] + h * p.out_strides[1], 0,
                     p.out_strides[3]);
        }
        ds.log_max[bh] = state.max;
      }
    }
    clock.done(arrived);
  }
}

}  // namespace favor::cpu
