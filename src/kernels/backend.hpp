#pragma once
// The one seam between the facades and the kernels: the kernels a backend provides, each
// taking the contract's params (kernels/*_params.hpp; docs/algorithms.md lists them). The
// facades validate, fill the params and call backend(); how a backend runs a kernel (the
// CPU's threads and chunk length) stays inside it. The pattern of favor::Exchange, which
// keeps MPI out of the sequence-parallel algorithm. Kernels never throw.
//
// The C++ library is CPU-only: it computes on host memory, on the CPU. This seam is an
// internal interface, not a device abstraction: it keeps the facades and src/core free of
// cpu:: (no src/*.cpp facade and nothing in src/core includes "cpu/..."), and it has one
// backend, the CPU (src/cpu/backend.cpp). Every pointer in the params is host memory;
// favor::TensorView is a host view with no device and no dtype (always float32), and the
// facades scan values on the host before any kernel runs (finiteness: check_finite in
// core/validate.hpp). Adding a Backend therefore adds no device: that would also need a
// device and dtype in TensorView, a choice in backend(), and the facades' value scans as
// backend ops. Other devices are served by the Python package's torch ops
// (python/favor/ops/): a favor:: torch.library op per algorithm runs these C++ kernels on
// CPU tensors, and the ops' device switch (ops/_tensors.py, backend()) sends CUDA tensors to
// fused Triton kernels and other devices to plain torch (docs/gpu.md).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/attention_params.hpp"
#include "kernels/band_params.hpp"
#include "kernels/codebook_params.hpp"
#include "kernels/decoder_params.hpp"
#include "kernels/moments_params.hpp"
#include "kernels/vq_decoder_params.hpp"
#include "kernels/vq_params.hpp"

namespace favor::kernels {

/// A backend's tile sizes and default block lengths, for cost models, benchmarks and the
/// facades' defaults (favor::kernel_info(); VQOptions::block = 0).
struct Tuning {
  int64_t row_tile;           // rows per feature tile (bidirectional)
  int64_t causal_chunk;       // chunk length C of causal FAVOR attention
  int64_t vq_block;           // default causal block length L of VQ attention
  int64_t vq_backward_block;  // ... and of its backward (and its bidirectional tile)
};

/// The sequence-parallel causal FAVOR backward in two phases (favor/sequence_parallel.hpp),
/// with the buffers the backend keeps between them, sized at creation (before the ranks agree
/// to go on: phase A then allocates nothing).
class CausalBackwardSplit {
 public:
  virtual ~CausalBackwardSplit() = default;
  /// The forward sweep from p.fwd.init_states: dq (and the decay gradient), and R of the
  /// slice's queries relative to its starting max.
  virtual void phase_a(const BackwardParams& p) = 0;
  /// After phase_a: R (B*H x F x (dv + 1)) and its reference, the starting max per head.
  virtual const std::vector<float>& r() const = 0;
  virtual const std::vector<double>& r_max() const = 0;
  /// The reverse sweep from the later ranks' R (relative to exp of suffix_ref[bh]): dk, dv.
  virtual void phase_b(const BackwardParams& p, const float* suffix_r,
                       const double* suffix_ref) = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Tuning tuning() const = 0;
  /// What favor::build_info() reports of the backend (CPU: "simd ...; blas ... (...)").
  virtual std::string describe() const = 0;
  /// Whether favor_bidirectional runs AttentionParams::bf16 in bf16 here (checked per call).
  virtual bool has_bf16() const { return false; }
  /// FAVOR attention; return the number of rows written as zeros.
  virtual int64_t favor_bidirectional(const AttentionParams& p) = 0;
  virtual int64_t favor_causal(const AttentionParams& p) = 0;
  /// Gradients of FAVOR attention.
  virtual void favor_backward_bidirectional(const BackwardParams& p) = 0;
  virtual void favor_backward_causal(const BackwardParams& p) = 0;
  /// The exact features of favor::features; the first row that overflows, if any.
  virtual FeatureOverflow features(const FeaturesParams& p) = 0;
  /// The sums of a FAVOR++ / FAVOR# fit (favor::kernel_moments).
  virtual void kernel_moments(const MomentsParams& p) = 0;
  /// C = alpha op(A) op(B) + beta C in double, row-major, on host memory: the small dense
  /// products of the FAVOR++ / FAVOR# projections (src/estimators.cpp).
  virtual void dgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha,
                     const double* A, int64_t lda, const double* B, int64_t ldb, double beta,
                     double* C, int64_t ldc) = 0;
  /// Sequence-parallel pieces (favor/sequence_parallel.hpp). Per head, the [S | s] of all
  /// keys (max in maxima) and, with distance (not null), the distance state
  /// sum_j (nk - j) phi(k_j) [v_j | 1] (B*H x F x (dv + 1) each).
  virtual void favor_key_states(const AttentionParams& p, float* states, double* maxima,
                                float* distance) = 0;
  /// The causal backward's two phases for `heads` heads of n queries.
  virtual std::unique_ptr<CausalBackwardSplit> favor_backward_causal_split(int64_t heads, int64_t n,
                                                                           int64_t features,
                                                                           int64_t dv) = 0;
  /// Exact softmax attention in float or double accumulation; returns the zero rows.
  virtual int64_t exact_attention(const AttentionParams& p, bool causal, bool in_double) = 0;
  virtual void exact_attention_backward(const BackwardParams& p, bool causal) = 0;
  /// The exact part of hybrid attention (kernels/band_params.hpp), merged with the estimated
  /// parts' rows into the output (returns the zero rows); its gradients added to dq, dk, dv.
  virtual int64_t band_attention(const BandParams& p) = 0;
  virtual void band_attention_backward(const BandBackwardParams& p) = 0;
  /// Causal hybrid attention, its estimated part fused with the exact part; returns the
  /// zero rows.
  virtual int64_t hybrid_causal(const HybridCausalParams& p) = 0;
  /// A hybrid decoder's query rows (kernels/band_params.hpp, BandDecodeParams).
  virtual void band_decode(const BandDecodeParams& p) = 0;
  /// Transformer-VQ attention; return the number of rows written as zeros.
  virtual int64_t vq_bidirectional(const VQParams& p) = 0;
  virtual int64_t vq_causal(const VQParams& p) = 0;
  /// Gradients of Transformer-VQ attention.
  virtual void vq_backward_bidirectional(const VQBackwardParams& p) = 0;
  virtual void vq_backward_causal(const VQBackwardParams& p) = 0;
  /// Sequence-parallel VQ pieces (favor/sequence_parallel.hpp). Per head, [Vsum | n] of
  /// every visible key (B*H x c x (dv + 1)).
  virtual void vq_key_states(const VQParams& p, float* states) = 0;
  /// Floats per head of the query-side sums a backward with code_sums_out writes: U (c x dv)
  /// and r (c); hard VQ adds the moments T (c x d x dv) and w (c x d) of every code.
  virtual int64_t vq_code_sums_size(const VQParams& p) = 0;
  /// The key pass for given query-side sums (per head, vq_code_sums_size floats, from queries
  /// that see every key of the call): adds their part to dv, dk and the assignment part of
  /// dcodebook (soft VQ).
  virtual void vq_backward_keys(const VQBackwardParams& p, const float* sums) = 0;
  /// The nearest code of every key (favor::vq_assign).
  virtual void vq_assign(const VQAssignParams& p) = 0;
  /// One step of a streaming FAVOR decoder (kernels/decoder_params.hpp).
  virtual void decoder_append(const DecoderAppend& p) = 0;
  virtual void decoder_query(const DecoderQuery& p) = 0;
  virtual void decoder_step(const DecoderStep& p) = 0;
  /// Codebook learning (kernels/codebook_params.hpp): a k-means run (codes <= the keys of
  /// every group), an EMA step (returns the codes re-seeded), sum_j |k_j - C_z|^2 over the
  /// keys in double, and that sum from the float differences with dk = grad (k - C_z)
  /// ([B, H, N, D], C-contiguous, zeroed by the caller).
  virtual std::unique_ptr<KMeansRun> kmeans(const CodebookKeys& keys, int64_t codes) = 0;
  virtual int64_t codebook_ema(const CodebookKeys& keys, const CodebookEMA& p) = 0;
  virtual double codebook_distance_sum(const CodebookQuantise& p) = 0;
  virtual double codebook_commitment(const CodebookQuantise& p, float grad, float* dk) = 0;
  /// A streaming Transformer-VQ decoder (kernels/vq_decoder_params.hpp): its codebook(s),
  /// `sets` x codes x d, prepared once; then each step.
  virtual std::shared_ptr<const PreparedCodebook> vq_prepare_codebook(const float* codebook,
                                                                      int64_t sets, int64_t codes,
                                                                      int64_t d) = 0;
  virtual void vq_decoder_append(const VQDecoderAppend& p) = 0;
  virtual void vq_decoder_query(const VQDecoderQuery& p) = 0;
  virtual void vq_decoder_step(const VQDecoderStep& p) = 0;
};

/// The backend the facades call: always the CPU (src/cpu/backend.cpp), with favor's runtime
/// configuration (num_threads()). There is no selection: the C++ library is CPU-only.
Backend& backend();

}  // namespace favor::kernels
