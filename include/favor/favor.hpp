#pragma once
/// \file favor.hpp
/// favor: fast random-feature attention. The umbrella header.
///
/// Layout contract (every function):
/// - Tensors are float32 [B, H, N, D]: batch, heads, sequence, head dim. Values may have
///   their own dim Dv; queries and keys may have different lengths Nq, Nk unless causal.
/// - Views carry element strides for each axis (any non-negative values); favor never
///   keeps a view beyond the call and never owns caller memory. Outputs are caller-owned
///   (or returned as favor::Tensor), fully overwritten, and must not alias inputs.
/// - Projections W are m x d row-major; phi maps D-vectors to F = m (positive) or 2m
///   (trig, hyperbolic) features. The kernel is exp(scale q.k), scale = 1/sqrt(D) unless set.
/// - Bad input (shapes, non-finite values, impossible parameters) throws favor::Error,
///   naming the argument and the rule; nothing is written to outputs in that case.
/// - Functions are thread-safe for distinct outputs; favor::Decoder is not.
#include "favor/attention.hpp"
#include "favor/backward.hpp"
#include "favor/codebook.hpp"
#include "favor/decoder.hpp"
#include "favor/error.hpp"
#include "favor/feature_map.hpp"
#include "favor/features.hpp"
#include "favor/fit.hpp"
#include "favor/hybrid_decoder.hpp"
#include "favor/kernel_rules.hpp"
#include "favor/metrics.hpp"
#include "favor/projection.hpp"
#include "favor/reference.hpp"
#include "favor/runtime.hpp"
#include "favor/sequence_parallel.hpp"
#include "favor/shape_rules.hpp"
#include "favor/tensor.hpp"
#include "favor/version.hpp"
#include "favor/vq.hpp"
#include "favor/vq_decoder.hpp"
