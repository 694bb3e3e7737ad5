// Causal hybrid attention in one sweep: causal FAVOR over the estimated part's view runs as
// usual and hands each chunk's [num | den] rows to a hook, which computes the exact terms of
// the same queries (band_rows) and merges both into the output while the rows are in cache.
// The queries before the part's first row (i < offset) take their exact terms alone. Memory:
// the sweep's and the band's per-thread workspaces, nothing of the sequence's size.
#include "cpu/hybrid_causal.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "cpu/attention_params.hpp"
#include "cpu/band_attention.hpp"
#include "cpu/schedule.hpp"
#include "cpu/tiles.hpp"

namespace favor::cpu {
namespace {

// A saved context's copy of rows [i0, i0 + rows) of head bh: y from the output and, where
// set, the part's log scales of those rows (view rows i0 - offset ...).
void save_rows(const kernels::HybridCausalParams& hp, int64_t bh, int64_t i0, int64_t rows,
               const double* scale) {
  if (hp.saved_y == nullptr) return;
  const kernels::AttentionParams& p = hp.band.p;
  const int64_t n = p.nq, dv = p.dv;
  const float* y = p.out + (bh / p.heads) * p.out_strides[0] + (bh % p.heads) * p.out_strides[1];
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = i0 + r;
    float* to = hp.saved_y + (bh * n + i) * dv;
    for (int64_t x = 0; x < dv; ++x) to[x] = y[i * p.out_strides[2] + x * p.out_strides[3]];
  }
  if (scale) std::copy_n(scale, rows, hp.saved_scale + bh * hp.part.nq + i0 - hp.offset);
}

class MergeHook final : public kernels::PartHook {
 public:
  explicit MergeHook(const kernels::HybridCausalParams& hp) : hp_(hp) {}

  void rows(int64_t bh, int64_t r0, int64_t rows, const float* yx,
            const double* shift) const override {
    const kernels::AttentionParams& p = hp_.band.p;
    const int64_t i0 = r0 + hp_.offset;
    const float* q = p.q + (bh / p.heads) * p.q_strides[0] + (bh % p.heads) * p.q_strides[1];
    double scale[kChunk];
    for (int64_t r = 0; r < rows; ++r) {
      if (std::isinf(shift[r])) {
        scale[r] = shift[r];
        continue;
      }
      const double q2 = kernels::squared_norm(q + (i0 + r) * p.q_strides[2], p.d, p.q_strides[3]);
      scale[r] = shift[r] + hp_.weight.at(hp_.part.map, bh, q2, r0 + r);
    }
    kernels::BandParams bp = hp_.band;
    kernels::BandPart& part = bp.parts[0];
    part.data = yx;
    part.shift = scale;
    part.offset = hp_.offset;
    part.first = r0;
    part.rows = rows;
    part.head_stride = 0;
    part.reversed = false;
    bp.part_count = 1;
    // the calling thread's own workspace (a kernel thread, or the caller's outside a parallel
    // region: omp_get_thread_num() would then be the caller's team's), kept between chunks
    auto lease = lend_band_workspaces(bp, 1);
    zero_rows_ += band_rows(bp, bh, i0, i0 + rows, lease.spaces().front());
    save_rows(hp_, bh, i0, rows, scale);
  }

  int64_t zero_rows() const { return zero_rows_.load(); }

 private:
  const kernels::HybridCausalParams& hp_;
  mutable std::atomic<int64_t> zero_rows_{0};
};

}  // namespace

int64_t hybrid_causal(const kernels::HybridCausalParams& hp, const Config& config) {
  const kernels::BandParams& band = hp.band;
  const int64_t heads = band.p.batch * band.p.heads, n = band.p.nq;
  const int64_t head_rows = std::min(hp.offset, n);
  // The queries before the part's first row: exact terms alone (band.part_count is 0).
  const Schedule plan = heads_only(heads, config.threads,
                                   double(heads * head_rows) * double(band.window + band.sinks) *
                                       (4.0 * double(band.p.d + band.p.dv)));
  int64_t zero_rows = 0;
  {
    auto lease = lend_band_workspaces(band, plan.team);  // given back before the sweep lends
    zero_rows = for_each_head(plan, lease.spaces(), [&](int64_t bh, BandWorkspace& ws) {
      const int64_t zeros = band_rows(band, bh, 0, head_rows, ws);
      save_rows(hp, bh, 0, head_rows, nullptr);
      return zeros;
    });
  }
  if (hp.offset >= n) return zero_rows;
  MergeHook hook(hp);
  kernels::AttentionParams part = hp.part;
  part.part_hook = &hook;
  favor_causal(part, config);
  return zero_rows + hook.zero_rows();
}

}  // namespace favor::cpu
