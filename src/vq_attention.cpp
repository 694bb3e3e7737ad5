// The Transformer-VQ facade: validates arguments (core/vq_validate.hpp), fills the kernel
// params and calls the backend (kernels/backend.hpp), for attention and for vq_assign.
#include <algorithm>
#include <vector>

#include "core/validate.hpp"
#include "core/vq_validate.hpp"
#include "favor/error.hpp"
#include "favor/vq.hpp"
#include "kernels/backend.hpp"

namespace favor {

VQStats vq_attention(TensorView q, TensorView k, TensorView v, TensorView codebook,
                     MutableTensorView out, const VQOptions& options) {
  std::vector<float> codebook_copy;
  detail::AttentionShape s{};
  kernels::VQParams p = detail::vq_params(q, k, v, codebook, options, codebook_copy, &s);
  detail::check_output(out, {s.batch, s.heads, s.nq, s.dv}, "out", {q, k, v, codebook});
  p.base.out = out.data;
  p.base.out_strides = out.strides;
  VQStats stats;
  kernels::Backend& be = kernels::backend();
  stats.zero_rows = options.causal ? be.vq_causal(p) : be.vq_bidirectional(p);
  return stats;
}

Tensor vq_attention(TensorView q, TensorView k, TensorView v, TensorView codebook,
                    const VQOptions& options, VQStats* stats) {
  Tensor out = detail::attention_output(q, v);  // the callee validates fully
  const VQStats st = vq_attention(q, k, v, codebook, out.mutable_view(), options);
  if (stats) *stats = st;
  return out;
}

void vq_assign(TensorView k, TensorView codebook, int32_t* codes, float* distances) {
  detail::check_view(k, "k");
  detail::check_finite(k, "k");
  const int64_t heads = k.shape[1], n = k.shape[2], d = k.shape[3];
  detail::check_codebook(codebook, heads, d);
  if (codes == nullptr) throw Error("codes: null pointer; needs room for B*H*N int32 values");
  const std::vector<float> book = detail::contiguous_codebook(codebook);
  kernels::VQAssignParams p{};
  kernels::AttentionParams& keys = p.keys.base;
  keys.k = k.data;
  keys.k_strides = k.strides;
  keys.batch = k.shape[0];
  keys.heads = heads;
  keys.nk = n;
  keys.d = d;
  p.keys.codebook = book.data();
  p.keys.codes = codebook.shape[2];
  p.keys.codebook_head_stride = codebook.shape[1] == 1 ? 0 : codebook.shape[2] * d;
  p.codes = codes;
  p.distances = distances;
  kernels::backend().vq_assign(p);
}

std::vector<int32_t> vq_assign(TensorView k, TensorView codebook) {
  detail::check_view(k, "k");
  std::vector<int32_t> codes(static_cast<size_t>(k.numel() / k.shape[3]));
  vq_assign(k, codebook, codes.data());
  return codes;
}

}  // namespace favor
