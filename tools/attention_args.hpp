#pragma once
// The options of favor attention, shared by the single-process command (attention_cmd.cpp)
// and its sequence-parallel form over MPI (attention_distributed.cpp).
#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli_common.hpp"
#include "fit_args.hpp"
#include "vq_args.hpp"

namespace favor::cli {

struct AttentionArgs {
  std::string q, k, v, out, method = "favor", kernel = "positive", key_mask, accumulate = "f32";
  bool causal = false;
  bool distributed = false;  // --distributed: one rank of mpirun, a slice of the sequence
  std::optional<double> scale;
  ProjectionArgs projection;
  FitArgs fit;
  VQArgs vq;
  std::string feature_map, feature_weights;  // --feature-map map.npz, --feature-weights W.npy
  std::vector<double> decay;                 // --decay
  int64_t window = 0, sinks = 0;             // --window, --sinks (hybrid attention)
  CLI::Option* kernel_opt = nullptr;
  CLI::Option* scale_opt = nullptr;
};

/// The map of --feature-map (which refuses the options it replaces), or the one the kernel,
/// projection, scale, fit and --feature-weights options describe; `qs` gives D and H.
FeatureMap attention_feature_map(const AttentionArgs& a, const Shape4& qs);
/// --decay: 1 or H values in (0, 1], causal attention only.
std::vector<double> attention_decay(const AttentionArgs& a, int64_t heads);

/// --method: favor, vq or exact; the favor-only options (--feature-map, --feature-weights,
/// --decay) refused with the others.
void check_method(const AttentionArgs& a);
/// The VQOptions of --causal, --scale, --vq-tau and --vq-block, checked (the caller sets the
/// key mask).
VQOptions attention_vq_options(const AttentionArgs& a);

/// favor attention --distributed (attention_distributed.cpp with MPI; without MPI,
/// no_distributed.cpp throws that it was built without).
void run_distributed_attention(const AttentionArgs& a);

}  // namespace favor::cli
