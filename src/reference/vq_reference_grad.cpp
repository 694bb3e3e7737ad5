// The double oracle of the Transformer-VQ gradients: the materialised formula of
// reference/vq_naive_grad.hpp per (batch, head), codes by double argmin.
#include <algorithm>
#include <cmath>

#include "core/validate.hpp"
#include "core/vq_validate.hpp"
#include "favor/error.hpp"
#include "favor/reference.hpp"
#include "reference/naive.hpp"
#include "reference/vq_naive_grad.hpp"

namespace favor::reference {
namespace {

std::vector<double> rows_of(const TensorView& t, int64_t b, int64_t h) {
  std::vector<double> out;
  out.reserve(static_cast<size_t>(t.shape[2] * t.shape[3]));
  for (int64_t n = 0; n < t.shape[2]; ++n)
    for (int64_t x = 0; x < t.shape[3]; ++x) out.push_back(t.at(b, h, n, x));
  return out;
}

DTensor zeros(const Shape4& shape) {
  return DTensor{
      shape, std::vector<double>(static_cast<size_t>(shape[0] * shape[1] * shape[2] * shape[3]))};
}

void put(DTensor& t, int64_t b, int64_t h, const std::vector<double>& rows) {
  const size_t offset = static_cast<size_t>((b * t.shape[1] + h) * t.shape[2] * t.shape[3]);
  std::copy(rows.begin(), rows.end(), t.values.begin() + static_cast<std::ptrdiff_t>(offset));
}

}  // namespace

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
  const int64_t shared = codebook.shape[1] == 1, c = codebook.shape[2];
  DGrads g;
  g.dq = zeros({s.batch, s.heads, s.nq, s.d});
  g.dk = zeros({s.batch, s.heads, s.nk, s.d});
  g.dv = zeros({s.batch, s.heads, s.nk, s.dv});
  g.dw.assign(static_cast<size_t>(codebook.shape[1] * c * s.d), 0.0);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t hc = shared ? 0 : h;
      vq_naive::Head<double> head{s.nq,
                                  s.nk,
                                  s.d,
                                  s.dv,
                                  c,
                                  rows_of(q, b, h),
                                  rows_of(k, b, h),
                                  rows_of(v, b, h),
                                  rows_of(codebook, 0, hc),
                                  {},
                                  {},
                                  options.tau};
      for (int64_t j = 0; options.key_mask && j < s.nk; ++j)
        head.mask.push_back(naive::key_visible(options.key_mask, b, j) ? 1 : 0);
      if (options.tau == 0.0) head.z = vq_naive::nearest(head.k, s.nk, s.d, head.C, c);
      const auto hg = vq_naive::backward(head, rows_of(dy, b, h), scale, options.causal);
      put(g.dq, b, h, hg.dq);
      put(g.dk, b, h, hg.dk);
      put(g.dv, b, h, hg.dv);
      for (size_t i = 0; i < hg.dc.size(); ++i) g.dw[hc * c * s.d + i] += hg.dc[i];
    }
  return g;
}

}  // namespace favor::reference
