#pragma once
/// \file attention.hpp
/// FAVOR+ attention (bidirectional, causal, masked, cross) in linear time and memory.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "favor/feature_map.hpp"
#include "favor/features.hpp"
#include "favor/projection.hpp"
#include "favor/tensor.hpp"

namespace favor {

/// Precision of the forward GEMMs of FAVOR attention (docs/numerics.md, "bf16 forward").
/// f32: float32 throughout. bf16: q, k, v, W and the features rounded to bfloat16 for the
/// GEMMs, fp32 accumulation, fp32 states, exp and output; runs where favor::bf16_available()
/// (AVX512-BF16 and oneDNN; not with FAVOR_NO_BF16 set) and for bidirectional attention
/// only. Elsewhere a bf16 request runs the f32 path; AttentionStats::precision says which ran.
enum class Precision { f32, bf16 };
/// "f32" or "bf16"; anything else throws favor::Error naming `argument`.
Precision parse_precision(const std::string& name, const std::string& argument);

struct AttentionOptions {
  Kernel kernel = Kernel::positive;
  /// Causal: query i sees keys j <= i. Requires Nq == Nk.
  bool causal = false;
  /// Temperature: attention is softmax(scale * q.k). Default 1/sqrt(D).
  std::optional<double> scale;
  /// Key padding mask [B, Nk]; masked keys leave numerator and denominator.
  std::optional<KeyMaskView> key_mask;
  /// FAVOR++ / FAVOR# parameters (estimators.hpp). Empty: bidirectional attention fits
  /// them to q and k; causal attention refuses (a fit on the sequence sees the future).
  std::optional<KernelFit> fit;
  /// Causal decay (DiJiang, RetNet): the weight of pair (i, j) times gamma^(i - j), gamma in
  /// (0, 1], one value shared by every head or one per head (H values). Empty: no decay; all
  /// ones reproduce it bit for bit. Causal attention only (bidirectional refuses it).
  std::vector<double> decay;
  /// GEMM precision of the forward pass (see Precision). The backward pass is float32.
  Precision precision = Precision::f32;
  /// Hybrid attention (docs/math.md, "Hybrid attention"): exact softmax on a window of
  /// `window` keys and on the first `sinks` visible keys, the estimator on every other key,
  /// one normaliser. Query i's window is {j : i - window < j <= i} (causal) or
  /// {j : |i - j| < window} (bidirectional); decay weighs an estimated key by
  /// gamma^(i - j - window) (it decays from the window's edge) and exact terms not at all.
  /// Needs Nq == Nk. window >= N is exact softmax; window = sinks = 0 (the default) is the
  /// plain method, bit for bit. A hybrid call runs in f32; with save_causal_states and
  /// window < N it saves a context (below; also the merged rows, N (2 Dv + 1) floats and 2N
  /// doubles per head more; bidirectional: the suffix's states and rows too, about twice the
  /// states and N (Dv + 1) floats and N doubles more).
  int64_t window = 0;
  int64_t sinks = 0;
  /// Causal (or hybrid), with a context (favor_attention's last argument): also save each
  /// 32-token chunk's starting state [S | s] and every row's [num | den], N ((F / 32) + 1)
  /// (Dv + 1) floats per head, so that favor_attention_backward runs one reverse sweep
  /// instead of recomputing the forward (docs/gradients.md). Off: a causal or hybrid
  /// context stays empty.
  bool save_causal_states = false;
};

/// What happened to rows whose output favor had to define (docs/numerics.md).
struct AttentionStats {
  /// Query rows written as zeros: no key was visible (all masked, or causal prefix all
  /// masked), or the estimated denominator was not positive (possible with the trig
  /// kernel, whose features take both signs) or underflowed.
  int64_t zero_rows = 0;
  /// The precision the forward GEMMs ran in (options.precision, or f32 where bf16 is not
  /// available or not implemented: causal attention).
  Precision precision = Precision::f32;
};

/// What a bidirectional favor_attention call can save for its backward pass: per (batch,
/// head) the key state [S | s] (F x (Dv + 1) floats) and its stabiliser, plus a fingerprint
/// of k, v, W, the mask and the options, which favor_attention_backward checks before using
/// it (a context from other inputs is refused, not silently used). Causal attention saves
/// nothing unless AttentionOptions::save_causal_states: then per head the state before every
/// chunk and after the last, [chunks + 1][F][Dv + 1] with its maxima, and every row's
/// [num | den] (the fingerprint then covers q too); else the backward pass recomputes.
/// Hybrid attention saves the same for its estimated part's N - window rows (bidirectional:
/// and its suffix's N - max(window, 1) rows after them), followed by the merge's rows:
/// maxima then also holds lse [B*H][N] and the parts' log scales, rows the merged y
/// [B*H][N][Dv] (favor/causal_context.hpp, hybrid_context_layout; src/hybrid.hpp).
/// A saved context held elsewhere (in a framework's tensors, say): AttentionContext's arrays,
/// borrowed, with their sizes (the backward checks them as it checks an AttentionContext's).
/// The backward reads every context through one: AttentionContext::view(), or one built on
/// the caller's memory, which must stay alive and unchanged during the call.
struct AttentionContextView {
  const float* states = nullptr;
  size_t states_size = 0;
  const double* maxima = nullptr;
  size_t maxima_size = 0;
  const float* rows = nullptr;
  size_t rows_size = 0;
  uint64_t fingerprint = 0;
  bool valid() const { return states_size != 0; }
};

struct AttentionContext {
  std::vector<float> states;   ///< [B*H][F][Dv + 1]; causal: [B*H][chunks + 1][F][Dv + 1]
  std::vector<double> maxima;  ///< [B*H]; causal: [B*H][chunks + 1]
  std::vector<float> rows;     ///< causal: [B*H][N][Dv + 1], each row's [num | den]
  uint64_t fingerprint = 0;
  bool valid() const { return !states.empty(); }
  AttentionContextView view() const {
    return {states.data(), states.size(), maxima.data(), maxima.size(),
            rows.data(),   rows.size(),   fingerprint};
  }
};

/// y = phi(Q) (phi(K)^T V) / phi(Q) (phi(K)^T 1), per (batch, head).
/// q: [B, H, Nq, D], k: [B, H, Nk, D], v: [B, H, Nk, Dv], out: [B, H, Nq, Dv] (caller-owned,
/// may not alias the inputs). Time O(B H (Nq + Nk) F (D + Dv)); memory O(threads * tile).
/// Thread-safe for distinct outputs. Throws favor::Error on any broken rule.
AttentionStats favor_attention(TensorView q, TensorView k, TensorView v, const Projection& w,
                               MutableTensorView out, const AttentionOptions& options = {},
                               AttentionContext* context = nullptr);

/// Convenience overload that allocates the output.
Tensor favor_attention(TensorView q, TensorView k, TensorView v, const Projection& w,
                       const AttentionOptions& options = {}, AttentionStats* stats = nullptr);

/// The same with any feature map (feature_map.hpp): learned projections, biases, feature
/// weights, Hedgehog. The map carries the kernel, scale and fit, so options.kernel, .scale
/// and .fit must keep their defaults (favor::Error otherwise); options gives causal, the
/// mask and the decay. The Projection overloads are this with FeatureMap{w, options.kernel}.
AttentionStats favor_attention(TensorView q, TensorView k, TensorView v, const FeatureMap& map,
                               MutableTensorView out, const AttentionOptions& options = {},
                               AttentionContext* context = nullptr);
Tensor favor_attention(TensorView q, TensorView k, TensorView v, const FeatureMap& map,
                       const AttentionOptions& options = {}, AttentionStats* stats = nullptr);

/// Accumulation precision of exact attention. f32 inputs whose float32 logits or sums could
/// overflow (bounds above 1e38, docs/numerics.md) are accumulated in f64 regardless.
enum class Accumulation { f32, f64 };

struct ExactOptions {
  bool causal = false;
  std::optional<double> scale;
  std::optional<KeyMaskView> key_mask;
  Accumulation accumulation = Accumulation::f32;
  /// Above 0: exact softmax over each query's window and the first `sinks` visible keys
  /// alone, as in hybrid attention (AttentionOptions::window, ::sinks) with the estimator
  /// removed (StreamingLLM's attention; the baseline a hybrid must beat). Needs Nq == Nk and
  /// f32 accumulation; O(N (window + sinks) D) per head.
  int64_t window = 0;
  int64_t sinks = 0;
};

/// What a windowed exact_attention call (ExactOptions::window or ::sinks) can save for its
/// backward: each query row's softmax log normaliser, lse [B*H][Nq] (-inf for a row with no
/// visible key), and a fingerprint of q, k, v, the output, the mask and the options, which
/// exact_attention_backward checks before using it (a context of other inputs is refused).
/// With it and the forward's output the backward skips rerunning the band's forward.
struct ExactContext {
  std::vector<double> lse;
  uint64_t fingerprint = 0;
  bool valid() const { return !lse.empty(); }
};

/// Exact softmax attention, blockwise with an online softmax: never materialises N x N.
/// Same shapes and rules as favor_attention. Rows with no visible key are zeros. With a
/// context, a windowed call saves its lse there (ExactContext; other calls leave it empty).
void exact_attention(TensorView q, TensorView k, TensorView v, MutableTensorView out,
                     const ExactOptions& options = {}, ExactContext* context = nullptr);
Tensor exact_attention(TensorView q, TensorView k, TensorView v, const ExactOptions& options = {});

}  // namespace favor
