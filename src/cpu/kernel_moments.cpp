// favor::kernel_moments on the CPU (kernels/moments_params.hpp): per head, the rows gathered
// unscaled (an exact copy; |row|^2 in double by the SIMD helper) in blocks of kMomentRows,
// their sum, and their Gram matrix by a syrk per block (FAVOR#) or their squared norms
// (FAVOR++); the scale is applied to the sums at the end. Heads spread over threads.
#include "cpu/kernel_moments.hpp"

#include <algorithm>
#include <vector>

#include "cpu/blas.hpp"
#include "cpu/feature_tile.hpp"
#include "cpu/team.hpp"

namespace favor::cpu {
namespace {

// Rows per Gram update: large enough for an efficient syrk (2048 x 64 doubles = 1 MiB).
constexpr int64_t kMomentRows = 2048;

// One head's moments of one row set inside a record: count, sum (d), second.
struct Moments {
  double* count;
  double* sum;
  double* second;
};

Moments moments_at(const MomentsParams& p, int64_t bh, int which) {
  const int64_t d = p.rows.d, size = 1 + d + (p.full ? d * d : 1);
  double* base = p.sums + bh * 2 * size + which * size;
  return {base, base + 1, base + 1 + d};
}

// Adds the n rows of a head (x, row stride sn, element stride sx; rows with keep[i * mask_n]
// == 0 left out when keep is not null), scaled by sqrt_scale, to `mo`.
void add_head_moments(const float* head, int64_t sn, int64_t sx, int64_t n, int64_t d,
                      const uint8_t* keep, int64_t mask_n, double sqrt_scale, bool full,
                      std::vector<float>& tile, std::vector<double>& dtile, const Moments& mo) {
  std::vector<double> sum(static_cast<size_t>(d), 0.0);
  std::vector<double> second(full ? static_cast<size_t>(d * d) : 0, 0.0);
  double half_norm2 = 0.0, norm2 = 0.0;
  int64_t rows = 0, count = 0;
  auto flush = [&] {
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = tile.data() + r * d;
      for (int64_t t = 0; t < d; ++t) sum[t] += row[t];
    }
    if (full && rows > 0) {
      std::copy(tile.begin(), tile.begin() + rows * d, dtile.begin());
      gram_upper(d, rows, dtile.data(), d, second.data(), d);
    }
    rows = 0;
  };
  for (int64_t i = 0; i < n; ++i) {
    if (keep && !keep[i * mask_n]) continue;
    gather_rows(head + i * sn, 0, sx, 1, d, 1.0f, tile.data() + rows * d, &half_norm2);
    norm2 += 2.0 * half_norm2;
    ++count;
    if (++rows == kMomentRows) flush();
  }
  flush();
  const double scale = sqrt_scale * sqrt_scale;
  *mo.count += static_cast<double>(count);
  for (int64_t t = 0; t < d; ++t) mo.sum[t] += sum[t] * sqrt_scale;
  if (full) {
    for (int64_t r = 0; r < d; ++r)
      for (int64_t c = r; c < d; ++c) {  // the upper triangle, mirrored
        mo.second[r * d + c] += second[r * d + c] * scale;
        if (c != r) mo.second[c * d + r] += second[r * d + c] * scale;
      }
  } else {
    mo.second[0] += norm2 * scale;
  }
}

}  // namespace

void kernel_moments(const MomentsParams& p, const Config& config) {
  const AttentionParams& s = p.rows;
  const int64_t d = s.d, heads = s.batch * s.heads;
  const int team = team_now(config.threads);  // one thread while contended (cpu/team.hpp)
  RegionClock clock(team);
#pragma omp parallel num_threads(team)
  {
    const int64_t arrived = clock.arrive();
    blas_on_calling_thread();
    std::vector<float> tile(static_cast<size_t>(kMomentRows * d));
    std::vector<double> dtile(p.full ? static_cast<size_t>(kMomentRows * d) : 0);
#pragma omp for schedule(dynamic) nowait
    for (int64_t bh = 0; bh < heads; ++bh) {
      const int64_t b = bh / s.heads, h = bh % s.heads;
      if (s.nq > 0)
        add_head_moments(s.q + b * s.q_strides[0] + h * s.q_strides[1], s.q_strides[2],
                         s.q_strides[3], s.nq, d, nullptr, 0, p.sqrt_scale, p.full, tile, dtile,
                         moments_at(p, bh, 0));
      if (s.nk > 0)
        add_head_moments(s.k + b * s.k_strides[0] + h * s.k_strides[1], s.k_strides[2],
                         s.k_strides[3], s.nk, d, s.mask ? s.mask + b * s.mask_stride_b : nullptr,
                         s.mask_stride_n, p.sqrt_scale, p.full, tile, dtile, moments_at(p, bh, 1));
    }
    clock.done(arrived);
  }
}

}  // namespace favor::cpu
