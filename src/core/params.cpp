#include "core/params.hpp"

#include <cmath>

namespace favor::detail {

kernels::AttentionParams attention_params(const TensorView& q, const TensorView& k,
                                          const TensorView& v, const AttentionShape& s,
                                          double scale, const std::optional<KeyMaskView>& mask) {
  kernels::AttentionParams p{};
  p.q = q.data;
  p.q_strides = q.strides;
  p.k = k.data;
  p.k_strides = k.strides;
  p.v = v.data;
  p.v_strides = v.strides;
  p.batch = s.batch;
  p.heads = s.heads;
  p.nq = s.nq;
  p.nk = s.nk;
  p.d = s.d;
  p.dv = s.dv;
  p.map.sqrt_scale = static_cast<float>(std::sqrt(scale));
  if (mask) {
    p.mask = mask->data;
    p.mask_stride_b = mask->stride_b;
    p.mask_stride_n = mask->stride_n;
  }
  return p;
}

}  // namespace favor::detail
