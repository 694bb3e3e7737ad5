#include "core/vq_validate.hpp"

#include <cmath>
#include <sstream>

#include "core/params.hpp"
#include "favor/error.hpp"
#include "kernels/backend.hpp"

namespace favor::detail {

void check_codebook(const TensorView& codebook, int64_t heads, int64_t d, const std::string& name) {
  check_view(codebook, name);
  const Shape4& s = codebook.shape;
  if (s[0] != 1 || (s[1] != 1 && s[1] != heads) || s[3] != d) {
    throw Error(name + ": shape " + shape_string(s) + " must be [1, H or 1, c, D] = [1, " +
                std::to_string(heads) + " or 1, c, " + std::to_string(d) + "]");
  }
  check_finite(codebook, name);
}

std::vector<float> contiguous_codebook(const TensorView& codebook) {
  const Shape4& s = codebook.shape;
  std::vector<float> values(static_cast<size_t>(s[1] * s[2] * s[3]));
  size_t i = 0;
  for (int64_t h = 0; h < s[1]; ++h)
    for (int64_t c = 0; c < s[2]; ++c)
      for (int64_t x = 0; x < s[3]; ++x) values[i++] = codebook.at(0, h, c, x);
  return values;
}

void check_vq_options(double tau, int64_t block) {
  if (!std::isfinite(tau) || tau < 0.0) {
    throw Error("tau: " + std::to_string(tau) +
                " must be finite and >= 0 (0: hard VQ, > 0: soft VQ temperature)");
  }
  // Below kMinSoftTau, 1/tau in float overflows (and 0 * inf is NaN at the nearest code);
  // any distance gap float can resolve already makes p(s|k) one-hot there: that is hard VQ.
  if (tau > 0.0 && tau < kMinSoftTau) {
    std::ostringstream msg;
    msg << "tau: " << tau << " must be 0 (hard VQ) or >= " << kMinSoftTau
        << " (smaller soft-VQ temperatures are hard VQ at float precision: pass 0)";
    throw Error(msg.str());
  }
  if (block < 0) {
    throw Error("block: " + std::to_string(block) + " must be >= 1 (or 0 for the default)");
  }
}

kernels::VQParams vq_params(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& codebook, const VQOptions& options,
                            std::vector<float>& codebook_copy, AttentionShape* shape, bool slices) {
  const AttentionShape s = check_inputs(q, k, v, options.causal, options.key_mask, slices);
  check_codebook(codebook, s.heads, s.d);
  check_vq_options(options.tau, options.block);
  const double scale = resolve_scale(options.scale, s.d);
  codebook_copy = contiguous_codebook(codebook);
  kernels::VQParams p{};
  p.base = attention_params(q, k, v, s, scale, options.key_mask);
  p.codebook = codebook_copy.data();
  p.codes = codebook.shape[2];
  p.codebook_head_stride = codebook.shape[1] == 1 ? 0 : codebook.shape[2] * s.d;
  p.scale = static_cast<float>(scale);
  p.tau = static_cast<float>(options.tau);
  p.block = options.block > 0 ? options.block : kernels::backend().tuning().vq_block;
  if (shape) *shape = s;
  return p;
}

}  // namespace favor::detail
