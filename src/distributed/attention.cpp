// favor::distributed's convenience calls: sequence-parallel FAVOR and Transformer-VQ
// attention and their backward passes over an MPI communicator, and the even split of a sequence
// over ranks. Each call builds its own MpiExchange (collective setup per call, see
// distributed.hpp for the persistent alternative). It is not cached as an attribute of the
// caller's communicator: the attribute's delete callback would free MPI handles from inside
// MPI_Comm_free or, for MPI_COMM_WORLD, MPI_Finalize.
#include "favor/distributed.hpp"
#include "favor/error.hpp"

namespace favor::distributed {

Slice even_slice(int64_t n, int rank, int size) {
  if (n < 0) throw Error("even_slice: n = " + std::to_string(n) + " must be >= 0");
  if (size < 1 || rank < 0 || rank >= size) {
    throw Error("even_slice: rank " + std::to_string(rank) + " of size " + std::to_string(size) +
                " must satisfy 0 <= rank < size");
  }
  // n r / P without overflow for any n and P < 2^31: split n = a P + b.
  const auto at = [n, size](int64_t r) { return n / size * r + n % size * r / size; };
  return {at(rank), at(rank + 1)};
}

SequenceParallelStats attention(TensorView q, TensorView k, TensorView v, const FeatureMap& map,
                                MutableTensorView out, const AttentionOptions& options,
                                MPI_Comm comm) {
  MpiExchange exchange(comm);
  return sequence_parallel_attention(q, k, v, map, out, options, exchange);
}

SequenceParallelStats attention(TensorView q, TensorView k, TensorView v, const Projection& w,
                                MutableTensorView out, const AttentionOptions& options,
                                MPI_Comm comm) {
  MpiExchange exchange(comm);
  return sequence_parallel_attention(q, k, v, w, out, options, exchange);
}

AttentionGrads attention_backward(TensorView q, TensorView k, TensorView v, TensorView dy,
                                  const FeatureMap& map, const AttentionOptions& options,
                                  bool with_parameter_grads, SequenceParallelStats* stats,
                                  MPI_Comm comm) {
  MpiExchange exchange(comm);
  return sequence_parallel_attention_backward(q, k, v, dy, map, options, exchange,
                                              with_parameter_grads, stats);
}

AttentionGrads attention_backward(TensorView q, TensorView k, TensorView v, TensorView dy,
                                  const Projection& w, const AttentionOptions& options,
                                  bool with_projection_grad, SequenceParallelStats* stats,
                                  MPI_Comm comm) {
  MpiExchange exchange(comm);
  return sequence_parallel_attention_backward(q, k, v, dy, w, options, exchange,
                                              with_projection_grad, stats);
}

SequenceParallelStats vq_attention(TensorView q, TensorView k, TensorView v, TensorView codebook,
                                   MutableTensorView out, const VQOptions& options, MPI_Comm comm) {
  MpiExchange exchange(comm);
  return sequence_parallel_vq_attention(q, k, v, codebook, out, options, exchange);
}

VQGrads vq_attention_backward(TensorView q, TensorView k, TensorView v, TensorView dy,
                              TensorView codebook, const VQOptions& options,
                              bool with_codebook_grad, SequenceParallelStats* stats,
                              MPI_Comm comm) {
  MpiExchange exchange(comm);
  return sequence_parallel_vq_attention_backward(q, k, v, dy, codebook, options, exchange,
                                                 with_codebook_grad, stats);
}

}  // namespace favor::distributed
