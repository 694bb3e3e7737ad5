#pragma once
// FAVOR++ / FAVOR# as positive features with a per-head effective projection and a
// per-feature log bias: log phi_f(x) = (W_h x)_f + b_hf - |x|^2/2 + c_h, where
// W_h row f = Q_h diag(sqrt(1 - 4 A_hl)) w_f, b_hf = sum_l A_hl w_fl^2 and
// c_h = sum_l log(1 - 4 A_hl) / 4 - log(m) / 2 (docs/estimators.md).
#include <cstdint>
#include <string>
#include <vector>

#include "favor/attention.hpp"
#include "favor/estimators.hpp"
#include "favor/projection.hpp"
#include "kernels/attention_params.hpp"

namespace favor::detail {

struct AdaptedProjection {
  int64_t heads = 0, m = 0, d = 0;
  std::vector<float> w;           // heads x m x d
  std::vector<float> bias;        // heads x m
  std::vector<double> log_const;  // heads
  KernelFit fitted;  // the fit to q and k that a call without AttentionOptions::fit made; or empty
};

/// Checks a fit against W and the number of (batch, head) pairs `heads` (fit.heads must
/// be 1 or heads; A_l finite and < 1/8; basis orthonormal); throws favor::Error naming
/// `argument` otherwise.
void check_fit(const KernelFit& fit, int64_t d, int64_t heads, const std::string& argument);
/// The effective projections of a checked fit, one per fit head.
AdaptedProjection adapt_projection(const KernelFit& fit, const Projection& w);
/// dL/dW through adapt_projection(fit, w), the fit held fixed, from the gradients with respect
/// to the per-head projections (dw_heads: fit.heads x m x d) and log biases (dbias: fit.heads
/// x m). With W_h = W diag(sqrt(1 - 4 A_h)) Q_h^T and b_hf = sum_l A_hl w_fl^2:
///   dL/dW = sum_h [dL/dW_h Q_h diag(sqrt(1 - 4 A_h)) + 2 diag(dL/db_h) W diag(A_h)].
std::vector<float> projection_grad(const KernelFit& fit, const Projection& w, const float* dw_heads,
                                   const float* dbias);

/// The effective projection of an attention call: empty for kernels without a fit;
/// otherwise options.fit, or (bidirectional only) a fit to q and k, kept in `fitted`. Causal
/// calls without a fit are refused: a fit on the sequence would let every position see
/// future tokens.
AdaptedProjection attention_projection(const TensorView& q, const TensorView& k,
                                       const AttentionOptions& options, double scale,
                                       const Projection& w);

}  // namespace favor::detail
