"""MPIExchange: the collectives of sequence-parallel attention over an mpi4py communicator.

- allgather: Allgather of int64; allgather_text: allgather (pickled objects);
- allreduce_sum: Allreduce(IN_PLACE, SUM);
- allreduce_states / exscan_states: Allreduce / Exscan with a user operation
  (MPI.Op.Create(..., commute=False)) that calls favor._core.combine_states on whole records
  (a contiguous datatype of record_bytes, so MPI never splits a record); the reverse scan runs
  on a communicator with the ranks reversed (comm.Split(0, size - 1 - rank), made at the
  first reverse scan, which every rank calls together).
MPI chooses the algorithms (log P steps for its tree and recursive-doubling variants).

Resources: the operation and the record datatypes (one per record size) are made once per
process and shared by every MPIExchange (freed at exit while MPI is still initialised); the
reversed communicator belongs to its exchange: free() or the exchange's collection frees it.
Make one exchange per communicator and keep it (an exchange made per call splits the
communicator again at every causal backward).
"""
import atexit

import numpy as np
from mpi4py import MPI

from .. import _core


def _combine(inbuf, inoutbuf, datatype):
    """The MPI operation: inoutbuf := inbuf (+) inoutbuf, inbuf from the lower ranks."""
    earlier = np.frombuffer(inbuf, dtype=np.uint8)
    later = np.frombuffer(inoutbuf, dtype=np.uint8)
    _core.combine_states(earlier, later, datatype.Get_size())


_OP = None  # the combine operation, made at the first state collective
_TYPES = {}  # record_bytes -> committed contiguous datatype of one record


def _op():
    global _OP
    if _OP is None:
        _OP = MPI.Op.Create(_combine, commute=False)
    return _OP


def _record_type(record_bytes):
    t = _TYPES.get(record_bytes)
    if t is None:
        t = _TYPES[record_bytes] = MPI.BYTE.Create_contiguous(record_bytes).Commit()
    return t


def _mpi_usable():
    """Whether MPI calls may still be made (initialised, not finalised)."""
    return MPI.Is_initialized() and not MPI.Is_finalized()


@atexit.register
def _free_shared():
    """Frees the operation and the datatypes; runs at exit before mpi4py finalises MPI (and
    does nothing when the program finalised it already)."""
    global _OP
    if not _mpi_usable():
        return
    for t in _TYPES.values():
        t.Free()
    _TYPES.clear()
    if _OP is not None:
        _OP.Free()
        _OP = None


class MPIExchange(_core.Exchange):
    """The Exchange of favor.distributed over an mpi4py communicator (None: COMM_WORLD).
    Launch with mpirun; every rank calls the same attention calls in the same order; rank
    order is sequence order. Make one per communicator and keep it for every call; free()
    (on every rank, as every call of the exchange) releases the communicator it made, as
    its collection does."""

    def __init__(self, comm=None):
        super().__init__()
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self._reversed = None

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

    def free(self):
        """Frees the reversed communicator this exchange made (a later reverse scan makes it
        again). MPI_Comm_free is collective in the MPI standard: call free() on every rank
        (OpenMPI and MPICH free an intracommunicator without communicating, so collection at
        different times is safe there). Does nothing once MPI is finalised (MPI_Finalize
        released everything)."""
        rev, self._reversed = getattr(self, "_reversed", None), None
        if rev is not None and _mpi_usable():
            rev.Free()

    def __del__(self):
        try:
            self.free()
        except Exception:  # noqa: BLE001  at interpreter exit mpi4py may be torn down already
            pass

    def _records(self, block, buf):
        return [buf, block.heads, _record_type(block.record_bytes)]

    def _reverse_comm(self):
        if self._reversed is None:
            self._reversed = self.comm.Split(0, self.size() - 1 - self.rank())
        return self._reversed

    def __repr__(self):
        return f"favor.distributed.MPIExchange(rank={self.rank()}, size={self.size()})"
