// The streaming Transformer-VQ decoder's fused step on the CPU (kernels/vq_decoder_params.hpp,
// VQDecoderStep): per (batch, head), assign the step's key and add it to the code sums and
// counts, then attend the step's query to the state after it, in one parallel region with
// the decoder's workspace (no allocation). Soft VQ updates the sums and reads them for the
// query in one sweep (vec_math update_and_read: the counts, and so the query's weights, are
// known before it). The same float operations, in the same order, as vq_decoder_append then
// vq_decoder_query (cpu/vq_decoder_step.cpp): the outputs are the same bits.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "cpu/attention_params.hpp"
#include "cpu/blas.hpp"
#include "cpu/feature_tile.hpp"
#include "cpu/schedule.hpp"
#include "cpu/vec_math.hpp"
#include "cpu/vq_decoder_step.hpp"

namespace favor::cpu {

void vq_decoder_step(const VQDecoderStep& ds, const Config& config) {
  const AttentionParams& p = ds.step.base;
  const int64_t c = ds.step.codes, d = p.d, dv = p.dv, heads = p.batch * p.heads;
  const bool soft = ds.step.tau > 0.0f;
  const float tau = ds.step.tau, scale = ds.step.scale;
  const auto& tables = static_cast<const PreparedCodes*>(ds.prepared)->tables;
  const double work = 2.0 * c * d + (soft ? 2.0 * c * dv : double(dv)) + 2.0 * c * (d + dv);
  const int threads = threads_for(heads, work, config.threads, 4e5);  // as the FAVOR step
  const int64_t per_thread = 2 * d + 2 * dv + 4 * c;
  if (ds.workspace->size() < static_cast<size_t>(threads * per_thread))
    ds.workspace->resize(static_cast<size_t>(threads * per_thread));
  const int team_size =
      team_now(threads, double(heads) * work);  // one thread while contended (cpu/team.hpp)
  RegionClock clock(team_size);
#pragma omp parallel num_threads(team_size)
  {
    const int64_t arrived = clock.arrive();
    blas_on_calling_thread();
    const int tid = omp_get_thread_num(), team = omp_get_num_threads();
    float* x = ds.workspace->data() + tid * per_thread;
    float *xq = x + d, *v = xq + d, *y = v + dv, *pk = y + dv, *logits = pk + c,
          *log_counts = logits + c, *e = log_counts + c;
    for (int64_t bh = heads * tid / team; bh < heads * (tid + 1) / team; ++bh) {
      const int64_t b = bh / p.heads, h = bh % p.heads;
      float* sums = ds.sums + bh * c * dv;
      float* counts = ds.counts + bh * c;
      const bool keep = p.mask == nullptr || p.mask[b * p.mask_stride_b] != 0;
      if (keep) {  // the key: its code(s), as vq_decoder_append
        const CodeTable& table = tables[ds.step.codebook_head_stride == 0 ? 0 : h];
        gather_rows(p.k + b * p.k_strides[0] + h * p.k_strides[1], p.k_strides[2], p.k_strides[3],
                    1, d, 1.0f, x, nullptr);
        gather_rows(p.v + b * p.v_strides[0] + h * p.v_strides[1], p.v_strides[2], p.v_strides[3],
                    1, dv, 1.0f, v, nullptr);
        int32_t z = 0;
        assign_rows(x, 1, table, tau, &z, pk);
        if (!soft) {
          float* row = sums + z * dv;
          for (int64_t i = 0; i < dv; ++i) row[i] += v[i];
          counts[z] += 1.0f;
        } else {
          for (int64_t s = 0; s < c; ++s) counts[s] += pk[s];
        }
      }
      // The query against the state after the key, as vq_decoder_query.
      log_or_neg_inf(counts, log_counts, c);
      gather_rows(p.q + b * p.q_strides[0] + h * p.q_strides[1], p.q_strides[2], p.q_strides[3], 1,
                  d, 1.0f, xq, nullptr);
      gemm(false, true, 1, c, d, scale, xq, d, ds.step.head_codebook(bh), d, 0.0f, logits, c);
      const float m = max_of_signed_sum(logits, 1.0f, log_counts, c);
      const bool update = keep && soft;  // the soft update of the sums, fused with the read
      float inv_den = 0.0f;
      if (std::isinf(m)) {
        if (update) rank1_update(sums, pk, v, c, dv);
        std::fill(y, y + dv, 0.0f);
      } else {
        exp_shift_live(logits, 1.0f, m, log_counts, e, c);
        if (update) {
          update_and_read(sums, pk, v, e, c, dv, y);
        } else {
          transposed_matvec(sums, e, c, dv, y);
        }
        inv_den = 1.0f / dot(e, counts, c);
      }
      float* row = p.out + b * p.out_strides[0] + h * p.out_strides[1];
      for (int64_t i = 0; i < dv; ++i) row[i * p.out_strides[3]] = y[i] * inv_den;
    }
    clock.done(arrived);
  }
}

}  // namespace favor::cpu
