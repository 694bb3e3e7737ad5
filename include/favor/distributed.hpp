#pragma once
/// \file distributed.hpp
/// favor::distributed: sequence-parallel FAVOR and Transformer-VQ attention over MPI (the
/// CMake target favor::distributed, built when MPI is found; the core library favor::favor
/// has no MPI in it). Each rank of a communicator holds a contiguous slice along N of q, k,
/// v (and of the key mask) of every (batch, head), rank order = sequence order; slices may
/// have any length, also 0. Only per-head states of F x (Dv + 1) floats (VQ: per-code sums
/// of c x (Dv + 1)) cross the network, whatever N (favor/sequence_parallel.hpp has the
/// algorithm and its rules, docs/distributed.md the figures).
///
/// Usage (every rank of `comm` makes the same calls in the same order, as for any MPI
/// collective; MPI must be initialised, with MPI_THREAD_FUNNELED or more if favor's OpenMP
/// threads run beside MPI calls of other threads):
///
///     const favor::distributed::Slice s = favor::distributed::even_slice(n, rank, size);
///     // q, k, v: this rank's rows [s.begin, s.end) of every (batch, head)
///     favor::distributed::attention(q, k, v, map, out, options);          // MPI_COMM_WORLD
///     favor::AttentionGrads g = favor::distributed::attention_backward(q, k, v, dy, map,
///                                                                      options, true);
///     // g.dq, g.dk, g.dv: this rank's slice; g.dw, g.dbias, ...: this rank's share, to be
///     // summed over ranks (MPI_Allreduce) like any data-parallel gradient.
///     favor::distributed::vq_attention(q, k, v, codebook, out, vq_options);  // Transformer-VQ
///     favor::VQGrads vg = favor::distributed::vq_attention_backward(q, k, v, dy, codebook,
///                                                                   vq_options, true);
///     // vg.dcodebook: this rank's share of dL/dC, to be summed over ranks.
///
/// Repeated calls (a training loop): the convenience calls below build an MpiExchange for
/// each call and free it after (MPI_Comm_dup, MPI_Comm_split, MPI_Op_create: a few setup
/// collectives on top of the handful the call makes itself, and with short slices collective
/// latency is most of a call's time). Make one MpiExchange instead and pass it to the calls
/// of favor/sequence_parallel.hpp:
///
///     favor::distributed::MpiExchange exchange(comm);  // once, collective over comm
///     for (...) {
///       favor::sequence_parallel_attention(q, k, v, map, out, options, exchange);
///       favor::AttentionGrads g = favor::sequence_parallel_attention_backward(
///           q, k, v, dy, map, options, exchange, true);
///     }
///
/// Errors: a rank whose inputs break a rule, or ranks that disagree on shapes (but N),
/// options, the feature map or the codebook, make every rank throw favor::Error (naming the
/// rank), never a hang. A failing MPI call throws favor::Error with MPI's message. Positions
/// in messages are those of the rank's own slice ("rank 2: q: element [1,2,9,3] is nan" is row
/// 9 of rank 2's rows, row s.begin + 9 of the sequence with s = even_slice(n, 2, size)).
///
/// CMake: find_package(favor COMPONENTS distributed) then link favor::distributed.
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "favor/sequence_parallel.hpp"

namespace favor::distributed {

/// favor::Exchange over an MPI communicator. The constructor duplicates `comm` (favor's
/// messages never mix with the caller's) and builds the reversed-order communicator of the
/// backward scans, so it is collective over `comm`; so is the destructor. Not copyable; one
/// exchange serves any number of calls, one at a time: make one for repeated calls rather
/// than paying that setup per call in the convenience calls.
class MpiExchange final : public Exchange {
 public:
  explicit MpiExchange(MPI_Comm comm = MPI_COMM_WORLD);
  ~MpiExchange() override;
  MpiExchange(const MpiExchange&) = delete;
  MpiExchange& operator=(const MpiExchange&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::vector<int64_t> allgather(const std::vector<int64_t>& values) override;
  std::vector<std::string> allgather_text(const std::string& text) override;
  void allreduce_sum(double* data, int64_t n) override;
  void allreduce_sum(float* data, int64_t n) override;
  /// MPI_Allreduce with an MPI operation over records (combine_states), in rank order.
  void allreduce_states(StateBlock& block) override;
  /// MPI_Exscan with the same operation (reverse: over the reversed communicator).
  void exscan_states(StateBlock& block, bool reverse) override;

  /// Bytes this rank handed to MPI calls, and seconds spent inside them, since the
  /// construction or the last reset_counters().
  int64_t bytes() const { return bytes_; }
  double seconds() const { return seconds_; }
  void reset_counters() {
    bytes_ = 0;
    seconds_ = 0.0;
  }

 private:
  void reduce_states(StateBlock& block, bool scan, MPI_Comm comm);
  void free_handles() noexcept;

  MPI_Comm comm_ = MPI_COMM_NULL;      // a duplicate of the caller's communicator
  MPI_Comm reversed_ = MPI_COMM_NULL;  // the same ranks, numbered P-1 .. 0
  MPI_Op combine_ = MPI_OP_NULL;       // combine_states, not commutative
  int rank_ = 0, size_ = 1;
  int64_t bytes_ = 0;
  double seconds_ = 0.0;
};

/// Rows [begin, end) of a sequence.
struct Slice {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};
/// The even split of n rows over `size` ranks: [n r / P, n (r + 1) / P) (lengths differ by
/// at most 1; ranks beyond n get empty slices).
Slice even_slice(int64_t n, int rank, int size);

/// favor::sequence_parallel_attention over `comm` (an MpiExchange made for the call: for
/// repeated calls make one and call favor::sequence_parallel_attention with it, see above).
SequenceParallelStats attention(TensorView q, TensorView k, TensorView v, const FeatureMap& map,
                                MutableTensorView out, const AttentionOptions& options = {},
                                MPI_Comm comm = MPI_COMM_WORLD);
SequenceParallelStats attention(TensorView q, TensorView k, TensorView v, const Projection& w,
                                MutableTensorView out, const AttentionOptions& options = {},
                                MPI_Comm comm = MPI_COMM_WORLD);

/// favor::sequence_parallel_attention_backward over `comm` (an MpiExchange made for the
/// call): dq, dk, dv of this rank's slice; the parameter gradients are this rank's share (sum
/// them over ranks).
AttentionGrads attention_backward(TensorView q, TensorView k, TensorView v, TensorView dy,
                                  const FeatureMap& map, const AttentionOptions& options = {},
                                  bool with_parameter_grads = false,
                                  SequenceParallelStats* stats = nullptr,
                                  MPI_Comm comm = MPI_COMM_WORLD);
AttentionGrads attention_backward(TensorView q, TensorView k, TensorView v, TensorView dy,
                                  const Projection& w, const AttentionOptions& options = {},
                                  bool with_projection_grad = false,
                                  SequenceParallelStats* stats = nullptr,
                                  MPI_Comm comm = MPI_COMM_WORLD);

/// favor::sequence_parallel_vq_attention over `comm` (an MpiExchange made for the call):
/// Transformer-VQ attention, this rank's slice of the output. Every rank passes the whole
/// codebook [1, Hc, c, D] (the same values: the ranks compare them and throw on a
/// disagreement).
SequenceParallelStats vq_attention(TensorView q, TensorView k, TensorView v, TensorView codebook,
                                   MutableTensorView out, const VQOptions& options = {},
                                   MPI_Comm comm = MPI_COMM_WORLD);

/// favor::sequence_parallel_vq_attention_backward over `comm` (an MpiExchange made for the
/// call): dq, dk, dv of this rank's slice; with with_codebook_grad, dcodebook is this rank's
/// share (sum it over ranks).
VQGrads vq_attention_backward(TensorView q, TensorView k, TensorView v, TensorView dy,
                              TensorView codebook, const VQOptions& options = {},
                              bool with_codebook_grad = false,
                              SequenceParallelStats* stats = nullptr,
                              MPI_Comm comm = MPI_COMM_WORLD);

}  // namespace favor::distributed
