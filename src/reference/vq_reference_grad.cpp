// The double oracle of the Transformer-VQ gradients: the materialised formula of
// reference/naive_vq.hpp per (batch, head), codes by double argmin.
#include "core/validate.hpp"
#include "core/vq_validate.hpp"
#include "favor/error.hpp"
#include "favor/reference.hpp"
#include "reference/naive_vq.hpp"

namespace favor::reference {

DGrads vq_attention_backward(TensorView q, TensorView k, TensorView v, TensorView dy,
                             TensorView codebook, const VQOptions& options) {
  const auto s = detail::check_attention_inputs(q, k, v, options.causal, options.key_mask);
  detail::check_codebook(codebook, s.heads, s.d);
  detail::check_vq_options(options.tau, options.block);
  detail::check_view(dy, "dy");
  if (dy.shape != Shape4{s.batch, s.heads, s.nq, s.dv}) {
    throw Error("dy: shape " + shape_string(dy.shape) +
                " must be the output's shape [B, H, Nq, Dv]");
  }
  const double scale = detail::resolve_scale(options.scale, s.d);
  const int64_t c = codebook.shape[2];
  DGrads g = naive::zero_grads(s);
  g.dw.assign(static_cast<size_t>(codebook.shape[1] * c * s.d), 0.0);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const auto head = vq_naive::head_of<double>(q, k, v, codebook, options, b, h);
      const auto hg =
          vq_naive::backward(head, naive::head_rows<double>(dy, b, h), scale, options.causal);
      naive::put_head(g.dq, b, h, hg.dq);
      naive::put_head(g.dk, b, h, hg.dk);
      naive::put_head(g.dv, b, h, hg.dv);
      const int64_t hc = codebook.shape[1] == 1 ? 0 : h;
      for (size_t i = 0; i < hg.dc.size(); ++i) g.dw[hc * c * s.d + i] += hg.dc[i];
    }
  return g;
}

}  // namespace favor::reference
