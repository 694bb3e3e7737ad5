#pragma once
/// \file sequence_parallel.hpp
/// Sequence-parallel FAVOR attention: P processes ("ranks") each hold a contiguous slice of
/// the sequence of every (batch, head), rank order = sequence order, and only per-head linear
/// states cross between them: O(B H F (Dv + 1)) numbers per call, whatever N
/// (docs/distributed.md). This header has no MPI in it: the algorithm talks to the other ranks
/// through the Exchange interface, which favor::distributed implements over MPI
/// (favor/distributed.hpp), favor.distributed over torch.distributed or mpi4py, and the tests
/// over threads.
#include <cstdint>
#include <string>
#include <vector>

#include "favor/attention.hpp"
#include "favor/backward.hpp"
#include "favor/feature_map.hpp"
#include "favor/projection.hpp"
#include "favor/tensor.hpp"
#include "favor/vq.hpp"

namespace favor {

/// Header of one head's record in a StateBlock.
struct StateHeader {
  double max;        ///< the values are relative to exp(max); -inf: an empty record (identity)
  double length;     ///< positions the record spans (the distance states' origin shift)
  int64_t size;      ///< floats per state
  int64_t distance;  ///< 1: a distance state D follows the state S (causal decay gradients)
};

/// Per-head stabilised states in one contiguous buffer of `heads` records, each a StateHeader
/// then S (size floats) and, with distance, D (size floats), padded to 8 bytes. S are sums
/// relative to exp(max); D = sum over the span of (end - position) times the same terms. The
/// buffer is what crosses the network: an implementation of Exchange moves records_bytes()
/// bytes per rank and combines records with combine_states.
class StateBlock {
 public:
  StateBlock() = default;
  /// `heads` empty records (max -inf, zeros, length 0).
  StateBlock(int64_t heads, int64_t size, bool distance = false);

  int64_t heads() const { return heads_; }
  int64_t size() const { return size_; }
  bool distance() const { return distance_; }
  /// Bytes of one record (header, S, D, padding) and of the block.
  int64_t record_bytes() const { return record_bytes_; }
  int64_t bytes() const { return heads_ * record_bytes_; }
  uint8_t* data() { return reinterpret_cast<uint8_t*>(storage_.data()); }
  const uint8_t* data() const { return reinterpret_cast<const uint8_t*>(storage_.data()); }

  StateHeader& header(int64_t head);
  const StateHeader& header(int64_t head) const;
  float* state(int64_t head);  ///< S of a head
  const float* state(int64_t head) const;
  float* distance_state(int64_t head);  ///< D of a head (distance blocks only)
  const float* distance_state(int64_t head) const;
  /// Every record empty (the identity of combine_states).
  void clear();

 private:
  int64_t heads_ = 0, size_ = 0, record_bytes_ = 0;
  bool distance_ = false;
  std::vector<uint64_t> storage_;  // the records, 8-byte aligned
};

/// The combination of sequence-parallel attention, record by record: `later` becomes
/// earlier (+) later, the sums of the two spans (earlier first) relative to the larger max;
/// distance states shift by the later span's length. Associative, so any reduction or scan
/// tree gives the same result to rounding; empty records are its identity. `count` records of
/// `record_bytes` bytes each (StateBlock::record_bytes()); this is the body of the MPI
/// operation and what a Python exchange calls.
void combine_states(const uint8_t* earlier, uint8_t* later, int64_t count, int64_t record_bytes);

/// The collective operations sequence-parallel attention needs, over the ranks that hold the
/// slices of one sequence. Every rank calls the same operations in the same order.
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Every rank's `values` (the same count on every rank), concatenated in rank order.
  virtual std::vector<int64_t> allgather(const std::vector<int64_t>& values) = 0;
  /// Every rank's text, in rank order (error messages; any length, also empty).
  virtual std::vector<std::string> allgather_text(const std::string& text) = 0;
  /// Element-wise sums over all ranks, in place.
  virtual void allreduce_sum(double* data, int64_t n) = 0;
  virtual void allreduce_sum(float* data, int64_t n) = 0;
  /// block = the combination (combine_states) of every rank's block, on every rank.
  virtual void allreduce_states(StateBlock& block) = 0;
  /// Exclusive scan in rank order: block = the combination of ranks 0 .. r-1 (reverse: of
  /// ranks P-1 .. r+1, the later rank as `earlier`); rank 0 (reverse: P-1) gets empty records.
  virtual void exscan_states(StateBlock& block, bool reverse) = 0;
};

/// For a rank that cannot make its sequence-parallel call (its arguments were refused before
/// it, e.g. by a language binding's conversions): joins the call's first collective, the
/// agreement on errors, with `message`, so that every rank throws the same favor::Error
/// naming this rank; throws it here too. vq: the message of sequence_parallel_vq_attention.
[[noreturn]] void refuse_sequence_parallel(Exchange& exchange, const std::string& message,
                                           bool vq = false);

/// What one sequence-parallel call did on this rank.
struct SequenceParallelStats {
  int64_t zero_rows = 0;      ///< as AttentionStats, for this rank's queries
  int64_t offset = 0;         ///< position of this rank's first key (and query, when causal)
  int64_t total = 0;          ///< keys over all ranks
  int64_t payload_bytes = 0;  ///< bytes this rank contributed to the state collectives
  int collectives = 0;        ///< collective operations called (agreement checks included)
};

/// favor_attention over a sequence split into slices across the ranks of `exchange`: this
/// rank's q [B, H, Nq_r, D], k [B, H, Nk_r, D], v [B, H, Nk_r, Dv], the mask [B, Nk_r] of its
/// keys, out [B, H, Nq_r, Dv]. Slices may have any length, also 0 (then the views' data may
/// be null). Bidirectional: every query sees every rank's keys; causal: Nq_r = Nk_r, and
/// query i of rank r sees the keys of ranks < r and its own keys <= i. The result equals
/// favor_attention on the concatenated sequence to float rounding. FAVOR++ / FAVOR# without
/// a fit (bidirectional) fit to the moments summed over ranks, so every rank uses the same
/// projection. Every rank validates its inputs, then the ranks compare a fingerprint of the
/// shapes, options and map: a broken rule on any rank, or a disagreement, throws
/// favor::Error on every rank instead of leaving another waiting in a collective.
SequenceParallelStats sequence_parallel_attention(TensorView q, TensorView k, TensorView v,
                                                  const FeatureMap& map, MutableTensorView out,
                                                  const AttentionOptions& options,
                                                  Exchange& exchange);
SequenceParallelStats sequence_parallel_attention(TensorView q, TensorView k, TensorView v,
                                                  const Projection& w, MutableTensorView out,
                                                  const AttentionOptions& options,
                                                  Exchange& exchange);

/// The backward pass of sequence_parallel_attention (same inputs, dy of this rank's
/// queries): dq, dk, dv of this rank's slice, and with with_parameter_grads the gradients of
/// the map's parameters and the decay restricted to this rank's terms: their sum over ranks
/// (as for every other parameter of a model whose sequence is split) is the gradient of the
/// whole sequence. Communication: bidirectional, the key state (allreduce) and the query-side
/// sums R = phi(Q)^T [dy / den, ...] (allreduce); causal, the prefix state (exclusive scan)
/// and the suffix sums R (reverse exclusive scan).
AttentionGrads sequence_parallel_attention_backward(TensorView q, TensorView k, TensorView v,
                                                    TensorView dy, const FeatureMap& map,
                                                    const AttentionOptions& options,
                                                    Exchange& exchange,
                                                    bool with_parameter_grads = false,
                                                    SequenceParallelStats* stats = nullptr);
AttentionGrads sequence_parallel_attention_backward(TensorView q, TensorView k, TensorView v,
                                                    TensorView dy, const Projection& w,
                                                    const AttentionOptions& options,
                                                    Exchange& exchange,
                                                    bool with_projection_grad = false,
                                                    SequenceParallelStats* stats = nullptr);

/// Transformer-VQ attention (favor/vq.hpp) over a sequence split into slices across the
/// ranks, with the contract of sequence_parallel_attention (slices of any length, also 0;
/// causal: Nq_r = Nk_r; the same validation and agreement, on the shapes but N, causal, the
/// codebook's values, scale, tau and mask presence; VQOptions::block need not agree, the
/// result does not depend on it). What crosses: the per-code sums [Delta^T V | Delta^T 1] of
/// the keys, B H c (Dv + 1) floats, plain sums of key weights in [0, 1] that need no
/// stabiliser (bidirectional: allreduce; causal: exclusive scan of StateBlock records with
/// max 0, which combine_states adds). The result equals vq_attention on the concatenated
/// sequence to float rounding.
SequenceParallelStats sequence_parallel_vq_attention(TensorView q, TensorView k, TensorView v,
                                                     TensorView codebook, MutableTensorView out,
                                                     const VQOptions& options, Exchange& exchange);

/// The backward pass of sequence_parallel_vq_attention (dy of this rank's queries): dq, dk,
/// dv of this rank's slice, exact as vq_attention_backward's (hard VQ: the straight-through
/// dk), and with with_codebook_grad this rank's share of dL/dC, [1, Hc, c, D]: the logit part
/// of its queries plus (soft VQ) the assignment part of its keys; the sum of the shares over
/// ranks is the gradient of the whole sequence. Communication: the key sums as in the
/// forward pass, then the query-side per-code sums U = W^T dY and r = W^T delta (and for
/// hard VQ the moments T = W^T vec(q dy^T), w = W^T (delta q) of every code): B H c (Dv + 1)
/// floats soft, B H c (D + 1) (Dv + 1) hard; bidirectional an allreduce, causal a reverse
/// exclusive scan (the later ranks' queries). Plain sums: the weights W are normalised
/// attention weights in [0, 1]. Hard VQ sends every code's moments, so every code takes the
/// moment route of the key gradient here (docs/vq.md).
VQGrads sequence_parallel_vq_attention_backward(TensorView q, TensorView k, TensorView v,
                                                TensorView dy, TensorView codebook,
                                                const VQOptions& options, Exchange& exchange,
                                                bool with_codebook_grad = false,
                                                SequenceParallelStats* stats = nullptr);

}  // namespace favor
