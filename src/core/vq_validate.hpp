#pragma once
// Argument checks and params of the Transformer-VQ entry points (attention, backward,
// decoder, codebook learning). Each check throws favor::Error naming the argument and rule.
#include <optional>
#include <string>
#include <vector>

#include "core/validate.hpp"
#include "favor/vq.hpp"
#include "kernels/vq_params.hpp"

namespace favor::detail {

/// A codebook view [1, Hc, c, D]: Hc == 1 or Hc == heads, D == d, every extent >= 1,
/// finite values. `name` names it in messages.
void check_codebook(const TensorView& codebook, int64_t heads, int64_t d,
                    const std::string& name = "codebook");
/// The codebook's values, C-contiguous [Hc][c][D].
std::vector<float> contiguous_codebook(const TensorView& codebook);
/// The smallest soft-VQ temperature: 1 / tau stays finite in float, far from overflow.
constexpr double kMinSoftTau = 1e-30;
/// tau finite and 0 or >= kMinSoftTau; block >= 0.
void check_vq_options(double tau, int64_t block);

/// Validates q, k, v, the mask, the codebook and the options together; fills the params
/// (the codebook pointing into `codebook_copy`, which the caller keeps alive). The caller
/// adds the output. With slices, Nq = 0 and Nk = 0 are allowed (sequence-parallel attention).
kernels::VQParams vq_params(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& codebook, const VQOptions& options,
                            std::vector<float>& codebook_copy, AttentionShape* shape = nullptr,
                            bool slices = false);

}  // namespace favor::detail
