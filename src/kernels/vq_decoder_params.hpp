#pragma once
// The kernel contract of one streaming Transformer-VQ decoder step (favor::VQDecoder),
// free of CPU policy. The state is, per head bh = b * heads + h and code s, the value sum
// sums_s (dv) and the count n_s of the keys assigned to s (soft VQ: both weighted by
// p(s|k)). The facade (src/vq_decoder.cpp) validates and fills; kernels never throw.
#include <cstdint>
#include <vector>

#include "kernels/vq_params.hpp"

namespace favor::kernels {

/// A codebook in the form a backend assigns keys with (the CPU: codes centred on their mean
/// and the centred norms, cpu/vq_assign.hpp), made once by Backend::vq_prepare_codebook and
/// shared by the copies of a decoder. Immutable.
class PreparedCodebook {
 public:
  virtual ~PreparedCodebook() = default;
};

/// Appends step.base.nk = T tokens step.base.k, step.base.v (step.base.mask: masked tokens
/// are skipped) to the state: each token adds its value to the sums of its code (hard VQ,
/// tau = 0) or p(s|k) v to every code's (soft), and 1 or p(s|k) to the counts.
struct VQDecoderAppend {
  VQParams step;                     // base: batch, heads, d, dv, k, v, nk, mask; codes, tau
  const PreparedCodebook* prepared;  // the codebook(s) of step, from vq_prepare_codebook
  float* sums;                       // [B*H][c][dv]
  float* counts;                     // [B*H][c]
};

/// Attends step.base.nq = T queries step.base.q to the state, into step.base.out
/// [B, H, T, dv]: y = sum_s e_s sums_s / sum_s e_s n_s, e_s = exp(scale q.C_s - m). A head
/// with no token yet gives zeros.
struct VQDecoderQuery {
  VQParams step;        // base: batch, heads, d, dv, q, nq, out; codebook, codes, scale
  const float* sums;    // [B*H][c][dv]
  const float* counts;  // [B*H][c]
};

/// One fused step (VQDecoder::step): appends one token per row, step.base.k and step.base.v
/// (nk = 1; step.base.mask [B, 1]: a masked row adds nothing), then attends step.base.q
/// (nq = 1) to the state after it, into step.base.out. The workspace belongs to the caller
/// (grown, never shrunk).
struct VQDecoderStep {
  VQParams step;  // base: batch, heads, d, dv, q, k, v, out, mask; codebook, codes, scale, tau
  const PreparedCodebook* prepared;
  float* sums;    // [B*H][c][dv]
  float* counts;  // [B*H][c]
  std::vector<float>* workspace;
};

}  // namespace favor::kernels
