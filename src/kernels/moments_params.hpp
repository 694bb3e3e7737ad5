#pragma once
// The kernel contract of favor::kernel_moments (the sums a FAVOR++ / FAVOR# fit is computed
// from), free of CPU policy. The facade (src/estimators.cpp) validates and fills; kernels never
// throw.
#include <cstdint>

#include "kernels/attention_params.hpp"

namespace favor::kernels {

/// Per head bh, one record of sums (KernelMoments::record() doubles): for the rows of q and
/// then those of k (masked keys left out), each multiplied by sqrt_scale, the row count
/// (1), the sum of the rows (d) and the sum of their outer products (d x d, full) or of their
/// squared norms (1). Added to `sums`, which the caller zeroes.
struct MomentsParams {
  AttentionParams rows;  // q, k (either may have no rows), batch, heads, nq, nk, d, mask
  double sqrt_scale;
  bool full;     // FAVOR#: outer products; FAVOR++: squared norms
  double* sums;  // [B*H][2 (1 + d + (full ? d * d : 1))]
};

}  // namespace favor::kernels
