// Transformer-VQ in double: the oracle of the VQ kernels (reference/naive_vq.hpp).
#include "core/validate.hpp"
#include "core/vq_validate.hpp"
#include "favor/reference.hpp"
#include "reference/naive_vq.hpp"

namespace favor::reference {

std::vector<int32_t> vq_assign(TensorView k, TensorView codebook) {
  detail::check_view(k, "k");
  detail::check_finite(k, "k");
  detail::check_codebook(codebook, k.shape[1], k.shape[3]);
  return naive::nearest_codes(k, codebook);
}

DTensor vq_attention(TensorView q, TensorView k, TensorView v, TensorView codebook,
                     const VQOptions& options) {
  const auto s = detail::check_attention_inputs(q, k, v, options.causal, options.key_mask);
  detail::check_codebook(codebook, s.heads, s.d);
  detail::check_vq_options(options.tau, options.block);
  const double scale = detail::resolve_scale(options.scale, s.d);
  return DTensor{{s.batch, s.heads, s.nq, s.dv},
                 naive::vq_attention<double>(q, k, v, codebook, options, scale)};
}

}  // namespace favor::reference
