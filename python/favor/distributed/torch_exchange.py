"""TorchExchange: the collectives of sequence-parallel attention over torch.distributed.

The process group must move CPU tensors (the gloo backend; NCCL moves only CUDA tensors).
What each collective does (P ranks in the group):
- allgather (shapes, options and lengths: a few integers): all_gather of int64 tensors;
- allgather_text (error messages): all_gather_object;
- allreduce_sum (FAVOR++ / FAVOR# moments, the backward's query-side sums R): all_reduce;
- allreduce_states (bidirectional key states): recursive doubling with isend / irecv,
  log2 P steps (floor(log2 P) + 2 when P is not a power of two), one block each way per step;
- exscan_states (causal prefix states; reverse: the backward's suffix sums): a Hillis-Steele
  scan with isend / irecv, ceil(log2 P) steps, one block each way per step.
The state collectives are point-to-point because the combination of two states is not a sum
(favor._core.combine_states rescales to the larger stabiliser, and is not commutative).
"""
import numpy as np
import torch
import torch.distributed as dist

from .. import _core
from . import _state_collectives


def _global_rank(group, rank):
    if group is None or group is dist.GroupMember.WORLD:
        return rank
    get = getattr(dist, "get_global_rank", None) or dist.distributed_c10d._get_global_rank
    return get(group, rank)


class TorchExchange(_core.Exchange):
    """The Exchange of favor.distributed over a torch.distributed process group (None: the
    default group), which must be initialised (torch.distributed.init_process_group('gloo',
    ...)) and able to move CPU tensors. Every rank of the group calls the same attention
    calls in the same order; rank order is sequence order."""

    def __init__(self, group=None):
        super().__init__()
        if not dist.is_available() or not dist.is_initialized():
            raise _core.Error("group: torch.distributed is not initialised; call "
                              "torch.distributed.init_process_group('gloo', ...) first (or "
                              "give an exchange, e.g. favor.distributed.MPIExchange())")
        self.group = group
        self._rank = dist.get_rank(group)
        self._size = dist.get_world_size(group)
        if self._rank < 0:
            raise _core.Error("group: this process is not a member of the group")

    def rank(self):
        return self._rank

    def size(self):
        return self._size

    def allgather(self, values):
        mine = torch.tensor(np.asarray(values, dtype=np.int64))
        parts = [torch.empty_like(mine) for _ in range(self._size)]
        dist.all_gather(parts, mine, group=self.group)
        return torch.cat(parts).numpy()

    def allgather_text(self, text):
        parts = [None] * self._size
        dist.all_gather_object(parts, text, group=self.group)
        return parts

    def allreduce_sum(self, values):
        total = _owned(values)
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=self.group)
        values[...] = total.numpy()

    def allreduce_states(self, block):
        _state_collectives.allreduce_states(block, self._rank, self._size, self._sendrecv)

    def exscan_states(self, block, reverse):
        _state_collectives.exscan_states(block, reverse, self._rank, self._size, self._sendrecv)

    def _sendrecv(self, dst, src, payload):
        """Sends payload to group rank dst and receives a block of the same size from src,
        concurrently (either may be None)."""
        works = []
        if dst is not None:
            works.append(dist.isend(_owned(payload), _global_rank(self.group, dst),
                                    group=self.group))
        got = None
        if src is not None:
            got = torch.empty(payload.size, dtype=torch.uint8)
            works.append(dist.irecv(got, _global_rank(self.group, src), group=self.group))
        for w in works:
            w.wait()
        return None if got is None else got.numpy()

    def __repr__(self):
        return f"favor.distributed.TorchExchange(rank={self._rank}, size={self._size})"


def _owned(array):
    """A torch-owned copy of a numpy array for a collective. gloo's worker threads may hold
    the last reference to a collective's tensor until the process ends; a tensor made by
    torch.from_numpy frees its numpy base through the GIL, which at interpreter exit aborts
    the process ("terminate called without an active exception", pytorch#179291). A copy
    frees without Python."""
    return torch.from_numpy(np.ascontiguousarray(array)).clone()
