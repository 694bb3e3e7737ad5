"""favor.distributed: sequence-parallel FAVOR and Transformer-VQ attention, forward and
backward, with the sequence of every (batch, head) split into contiguous slices over
processes ("ranks"; rank order = sequence order; slices of any length, also empty). Only
per-head states cross between ranks: O(B H F (Dv + 1)) numbers per call (VQ: the per-code
sums, c codes in place of F features), whatever the sequence length.

- attention(q, k, v, ..., group=None, exchange=None): favor.torch.attention on this rank's
  slice, through the torch op favor::sequence_parallel_attention (favor/ops/sequence_parallel),
  whose backward does the reverse communication.
- vq_attention(q, k, v, codebook, ..., group=None, exchange=None): favor.torch.vq_attention
  on this rank's slice, likewise (favor::sequence_parallel_vq_attention).
- attention_numpy / attention_backward_numpy, vq_attention_numpy /
  vq_attention_backward_numpy: the numpy API (favor.attention's or favor.vq_attention's
  arguments and an exchange).
- TorchExchange(group=None): the collectives over torch.distributed (gloo, CPU tensors).
- MPIExchange(comm=None): the collectives over an mpi4py communicator (launch with mpirun);
  make one per communicator and keep it (free() releases the communicator it makes).
- Exchange: subclass it to bring another transport (rank, size, allgather, allgather_text,
  allreduce_sum, allreduce_states, exscan_states); StateBlock and combine_states are what
  the state collectives move and reduce with.

Errors: any error a rank meets before its C++ call (a broken rule, a wrong argument type, a
0-d tensor) raises the same favor.Error on every rank, naming the rank (on that rank raised
from the original exception); an exception inside an exchange's method does not reach the
other ranks (docs/python.md, Errors).

Gradients: dq, dk, dv are this rank's slice; the gradients of parameters (the map's, a
codebook's, and every other parameter of a model whose sequence is split) are this rank's
share: sum them over ranks after backward (torch.distributed.all_reduce of each .grad).
Docs: docs/python.md.

torch and mpi4py are imported when first used (importing mpi4py initialises MPI).
"""
from .._core import Exchange, SequenceParallelStats, StateBlock, combine_states
from .numpy_api import (attention_backward_numpy, attention_numpy, vq_attention_backward_numpy,
                        vq_attention_numpy)

_LAZY = {"attention": ".function", "vq_attention": ".vq_function",
         "TorchExchange": ".torch_exchange", "MPIExchange": ".mpi_exchange"}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'favor.distributed' has no attribute '{name}'")


def __dir__():
    return sorted(list(globals()) + list(_LAZY))


__all__ = ["Exchange", "MPIExchange", "SequenceParallelStats", "StateBlock", "TorchExchange",
           "attention", "attention_backward_numpy", "attention_numpy", "combine_states",
           "vq_attention", "vq_attention_backward_numpy", "vq_attention_numpy"]
