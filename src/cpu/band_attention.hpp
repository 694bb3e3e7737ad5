#pragma once
// The exact part of hybrid attention (kernels/band_params.hpp): softmax terms over each
// query's window and sinks, O(N (w + s) D) per head, in tiles of kBandTile queries.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu/config.hpp"
#include "cpu/schedule.hpp"
#include "kernels/band_params.hpp"

namespace favor::cpu {

// 32 queries: a causal tile's keys are 32 + w - 1, of which each row sees w (w = 64: two
// thirds of the products used, against half at 64 queries); 16 saved no more time.
constexpr int64_t kBandTile = 32;

/// A thread's scratch for band_rows and band_backward.
struct BandWorkspace {
  std::vector<float> q, k, v, dy, y;  // the tile's rows when gathered; its dy and merged y
  std::vector<float> qt, dyt;         // the tile's Q^T and (backward) dY^T
  std::vector<float> s, ss;           // scores: window [kBandTile][span], sinks [kBandTile][sinks]
  std::vector<float> ks, vs;          // the sinks' keys and values, gathered
  std::vector<float> o;               // forward: the tile's exact [num | den] rows
  std::vector<float> dp, dps;         // backward: dP (window, sinks)
  std::vector<float> dks, dvs;        // backward: the sinks' dk, dv of the tile
  int64_t span;
  BandWorkspace(int64_t d, int64_t dv, int64_t span_, int64_t sinks)
      : q(kBandTile * d),
        k(span_ * d),
        v(span_ * dv),
        dy(kBandTile * dv),
        y(kBandTile * dv),
        qt(kBandTile * d),
        dyt(kBandTile * dv),
        s(kBandTile * span_),
        ss(kBandTile * std::max<int64_t>(sinks, 1)),
        ks(std::max<int64_t>(sinks, 1) * d),
        vs(std::max<int64_t>(sinks, 1) * dv),
        o(kBandTile * (dv + 1)),
        dp(kBandTile * span_),
        dps(kBandTile * std::max<int64_t>(sinks, 1)),
        dks(std::max<int64_t>(sinks, 1) * d),
        dvs(std::max<int64_t>(sinks, 1) * dv),
        span(span_) {}
};

/// Each row's exact [num | den], merged with the estimated parts' rows, into p.p.out (y_i)
/// and p.lse (lse_i, where set); returns the zero rows.
int64_t band_forward(const kernels::BandParams& p, const Config& config);
/// Rows [begin, end) of head bh as band_forward computes them; returns the zero rows.
int64_t band_rows(const kernels::BandParams& p, int64_t bh, int64_t begin, int64_t end,
                  BandWorkspace& ws);
/// One workspace per thread of a team, lent between calls (cpu/schedule.hpp).
LentWorkspaces<BandWorkspace> lend_band_workspaces(const kernels::BandParams& p, int team);
/// A hybrid decoder's query rows, on the calling thread (a step's work is a few dot
/// products per head).
void band_decode(const kernels::BandDecodeParams& p);
/// Query t of head bh of band_decode: its exact part merged with the linear state's row
/// part_row ([num | den]) at log scale part_shift, into p.out. scratch: band_decode_floats.
void band_decode_row(const kernels::BandDecodeParams& p, int64_t bh, int64_t t,
                     const float* part_row, double part_shift, float* scratch);
inline int64_t band_decode_floats(const kernels::BandDecodeParams& p) {
  return p.d + std::max<int64_t>(p.window + p.sinks, 1) + 2 * (p.dv + 1);
}
/// Adds the exact terms' gradients (given the merged output) to dq, dk, dv.
void band_backward(const kernels::BandBackwardParams& p, const Config& config);

}  // namespace favor::cpu
