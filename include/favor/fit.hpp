#pragma once
/// \file fit.hpp
/// Fitting a feature map to data by distillation (Hedgehog; DiJiang's WPFF weights): the map's
/// learned parameters (per-head projections W, biases b, feature weights lambda) are trained
/// so that favor attention matches exact softmax attention on training sequences: the loss is
/// the mean squared error of the attention output, its gradients come from favor's own
/// backward pass, the optimiser is Adam. Another objective (the Python fit's row-wise KL of the
/// attention weights, favor.fit_features(objective="kl")) plugs in as FitOptions::objective:
/// the loop, the optimiser, the parameter sets, the lambda floor and the held-out error stay
/// this one. See docs/estimators.md.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "favor/attention.hpp"
#include "favor/backward.hpp"
#include "favor/feature_map.hpp"
#include "favor/tensor.hpp"

namespace favor {

/// A training objective other than the attention-output MSE: given the map after some Adam
/// updates (its learned parameters the ones being fitted), returns the training loss and sets
/// grads.dw, grads.dbias, grads.dlambda (as many values as map.weights, map.bias, map.lambda)
/// for the parameters the fit learns; the others are ignored.
using FitObjective = std::function<double(const FeatureMap& map, AttentionGrads& grads)>;

struct FitOptions {
  int steps = 200;
  double learning_rate = 0.01;  ///< Adam's step size
  double beta1 = 0.9, beta2 = 0.999, epsilon = 1e-8;
  bool causal = false;
  /// What to learn; each must be set in the starting map or is created by
  /// FeatureMap::learnable (one set per head, H).
  bool learn_weights = true, learn_bias = true, learn_lambda = true;
  /// Feature weights must stay nonzero: after every step each |lambda_f| is raised to at
  /// least this (its sign kept). Only ratios of lambda^2 matter, and a weight at the floor
  /// leaves its feature 1e-6 of the weight of one at 1: practically off, still invertible.
  double lambda_floor = 1e-3;
  /// Held-out error every this many steps (and at steps 0 and `steps`); 0: only at 0 and the end.
  int eval_every = 1;
  uint64_t seed = 0;  ///< for anything random in the fit (the map's projection has its own)
  /// Empty: the mean squared error of the attention output on the training sequences, with
  /// gradients from favor_attention_backward. Set: this objective instead (the training
  /// sequences' exact attention is then only checked, not used).
  FitObjective objective;
};

/// Throws favor::Error naming the first bad option ("options.steps: ...").
void check_fit_options(const FitOptions& options);

/// The lambda floor (FitOptions::lambda_floor) applied in place to n feature weights: each
/// |lambda_f| below `floor` becomes `floor` (in float), its sign kept.
void floor_lambda(float* lambda, size_t n, double floor);

/// How many of n items (the sequences of a batch, or the tokens of one sequence) a holdout
/// fraction holds out: fraction * n rounded half away from zero, at least 1 and at most n - 1.
/// Throws favor::Error naming `name` for a fraction outside (0, 1) or n < 2.
int64_t heldout_count(double fraction, int64_t n, const std::string& name = "holdout");

/// One evaluated step: the map after `step` Adam updates (0: the starting map), its training
/// loss (mean squared error of the attention output over every element of the training
/// sequences) and its relative attention-output error |y - y_exact|_F / |y_exact|_F on the
/// held-out sequences.
struct FitStep {
  int step = 0;
  double loss = 0.0;
  double heldout_error = 0.0;
  double seconds = 0.0;  ///< wall time since the fit began
};

struct FitResult {
  FeatureMap map;                ///< after options.steps updates
  std::vector<FitStep> history;  ///< the evaluated steps in order; the first is step 0
};

/// Sequences to fit on: q, k [B, H, N, D], v [B, H, N, Dv] (their own exact attention is the
/// target), optional key mask.
struct FitData {
  TensorView q, k, v;
  std::optional<KeyMaskView> key_mask;
};

/// Fits `start`'s learned parameters (per head: heads 1 or H) to `train`, reporting the
/// held-out error on `heldout` (same H, D, Dv; any B, N) as it goes; on_step (optional) sees
/// every evaluated step as it happens. The exact targets are computed once (exact_attention,
/// blockwise, with the map's scale); each step then costs one favor_attention and one
/// favor_attention_backward on `train` (bidirectional: the backward reuses the forward's
/// context) plus, when evaluated, one favor_attention on `heldout` (with options.objective:
/// one call of it instead of the forward and backward on `train`). The parameters the start
/// has but options do not learn stay fixed. The result is a function of the inputs, the
/// options and the thread count (the same bits on a rerun). Throws favor::Error on bad shapes
/// (naming train or heldout), bad options, a FAVOR++ / FAVOR# start, a start with B*H
/// parameter sets, or a non-finite loss or update (with the step).
FitResult fit_features(const FitData& train, const FitData& heldout, FeatureMap start,
                       const FitOptions& options = {},
                       const std::function<void(const FitStep&)>& on_step = {});

}  // namespace favor
