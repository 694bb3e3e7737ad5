// The Transformer-VQ backward facade: validates like the forward pass (core/vq_validate) plus
// dy, allocates zeroed gradients and calls the backend.
#include <vector>

#include "core/validate.hpp"
#include "core/vq_validate.hpp"
#include "favor/error.hpp"
#include "favor/vq.hpp"
#include "kernels/backend.hpp"

namespace favor {

VQGrads vq_attention_backward(TensorView q, TensorView k, TensorView v, TensorView dy,
                              TensorView codebook, const VQOptions& options,
                              bool with_codebook_grad) {
  std::vector<float> codebook_copy;
  detail::AttentionShape s;
  kernels::VQBackwardParams bp{};
  bp.fwd = detail::vq_params(q, k, v, codebook, options, codebook_copy, &s);
  detail::check_dy(dy, s);
  // The backward's own default block: its hard-VQ moment update is a GEMM with K = L.
  if (options.block == 0) bp.fwd.block = kernels::backend().tuning().vq_backward_block;
  bp.dy = dy.data;
  bp.dy_strides = dy.strides;
  VQGrads g;
  g.dq = Tensor({s.batch, s.heads, s.nq, s.d});
  g.dk = Tensor({s.batch, s.heads, s.nk, s.d});
  g.dv = Tensor({s.batch, s.heads, s.nk, s.dv});
  bp.dq = g.dq.data();
  bp.dk = g.dk.data();
  bp.dv = g.dv.data();
  if (with_codebook_grad) {
    g.dcodebook = Tensor({1, codebook.shape[1], codebook.shape[2], s.d});
    bp.dcodebook = g.dcodebook.data();
  }
  if (options.causal) {
    kernels::backend().vq_backward_causal(bp);
  } else {
    kernels::backend().vq_backward_bidirectional(bp);
  }
  return g;
}

}  // namespace favor
