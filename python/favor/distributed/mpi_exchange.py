"""MPIExchange: the collectives of sequence-parallel attention over an mpi4py communicator.

- allgather: Allgather of int64; allgather_text: allgather (pickled objects);
- allreduce_sum: Allreduce(IN_PLACE, SUM);
- allreduce_states / exscan_states: Allreduce / Exscan with a user operation
  (MPI.Op.Create(..., commute=False)) that calls favor._core.combine_states on whole records
  (a contiguous datatype of record_bytes, so MPI never splits a record); the reverse scan runs
  on a communicator with the ranks reversed (comm.Split(0, size - 1 - rank), made at the
  first reverse scan, which every rank calls together).
MPI chooses the algorithms (log P steps for its tree and recursive-doubling variants).
"""
import numpy as np
from mpi4py import MPI

from .. import _core


def _combine(inbuf, inoutbuf, datatype):
    """The MPI operation: inoutbuf := inbuf (+) inoutbuf, inbuf from the lower ranks."""
    earlier = np.frombuffer(inbuf, dtype=np.uint8)
    later = np.frombuffer(inoutbuf, dtype=np.uint8)
    _core.combine_states(earlier, later, datatype.Get_size())


_OP = None


def _op():
    global _OP
    if _OP is None:
        _OP = MPI.Op.Create(_combine, commute=False)
    return _OP


class MPIExchange(_core.Exchange):
    """The Exchange of favor.distributed over an mpi4py communicator (None: COMM_WORLD).
    Launch with mpirun; every rank calls the same attention calls in the same order; rank
    order is sequence order."""

    def __init__(self, comm=None):
        super().__init__()
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self._reversed = None
        self._types = {}

    def rank(self):
        return self.comm.Get_rank()

    def size(self):
        return self.comm.Get_size()

    def allgather(self, values):
        mine = np.ascontiguousarray(values, dtype=np.int64)
        out = np.empty(mine.size * self.size(), dtype=np.int64)
        self.comm.Allgather(mine, out)
        return out

    def allgather_text(self, text):
        return self.comm.allgather(text)

    def allreduce_sum(self, values):
        self.comm.Allreduce(MPI.IN_PLACE, values, op=MPI.SUM)

    def allreduce_states(self, block):
        self.comm.Allreduce(MPI.IN_PLACE, self._records(block, block.bytes), op=_op())

    def exscan_states(self, block, reverse):
        comm = self._reverse_comm() if reverse else self.comm
        mine = block.bytes.copy()
        comm.Exscan(self._records(block, mine), self._records(block, block.bytes), op=_op())
        if comm.Get_rank() == 0:  # MPI leaves the first rank's result undefined
            block.clear()

    def _records(self, block, buf):
        t = self._types.get(block.record_bytes)
        if t is None:
            t = MPI.BYTE.Create_contiguous(block.record_bytes).Commit()
            self._types[block.record_bytes] = t
        return [buf, block.heads, t]

    def _reverse_comm(self):
        if self._reversed is None:
            self._reversed = self.comm.Split(0, self.size() - 1 - self.rank())
        return self._reversed

    def __repr__(self):
        return f"favor.distributed.MPIExchange(rank={self.rank()}, size={self.size()})"
