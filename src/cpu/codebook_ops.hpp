#pragma once
// Codebook learning on the CPU (kernels/codebook_params.hpp): k-means runs, the EMA step, the
// quantisation error and the commitment loss over the gathered key groups.
#include <cstdint>
#include <memory>

#include "cpu/config.hpp"
#include "kernels/codebook_params.hpp"

namespace favor::cpu {

/// A k-means run (cpu/vq_kmeans.hpp) on the gathered keys; codes <= every group's size.
std::unique_ptr<kernels::KMeansRun> kmeans_run(const kernels::CodebookKeys& keys, int64_t codes,
                                               const Config& config);
/// One EMA step (cpu/vq_ema.hpp); returns the number of codes re-seeded.
int64_t ema_step(const kernels::CodebookKeys& keys, const kernels::CodebookEMA& p,
                 const Config& config);
/// sum_j |k_j - C_z|^2 over the keys, in key order, in double.
double distance_sum(const kernels::CodebookQuantise& p, const Config& config);
/// sum_j |k_j - C_z|^2 as above, from the float differences; dk [B, H, N, D] (C-contiguous,
/// zeroed by the caller) gets grad (k_j - C_z) at every unmasked key.
double commitment_sum(const kernels::CodebookQuantise& p, float grad, float* dk,
                      const Config& config);

}  // namespace favor::cpu
