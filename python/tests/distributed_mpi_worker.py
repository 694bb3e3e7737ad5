"""One rank of test_distributed_mpi.py's mpirun run: favor.distributed over mpi4py
(MPIExchange), distributed_cases.run_all, then what MPIExchange frees (free_case), results
as JSON (OUT_PREFIX.RANK.json).

mpirun -np P python3 distributed_mpi_worker.py LENGTHS OUT_PREFIX [CASE ...]
"""
import gc
import json
import sys
import traceback

import numpy as np
import torch
from mpi4py import MPI

import favor
import favor.distributed as fd
from distributed_cases import run_all


def free_case(comm, used):
    """MPIExchange's resources: `used` (an exchange whose causal backwards made its reversed
    communicator) frees it with free() (twice is harmless; a later reverse scan makes it
    again), a collected exchange frees its own, the operation and the record datatypes are
    shared by every exchange (and freed by the exit handler), and after MPI_Finalize free(),
    collection and the exit handler do nothing (no MPI call)."""
    from favor.distributed import mpi_exchange

    rev = used._reversed
    assert rev is not None and rev != MPI.COMM_NULL, rev
    used.free()
    used.free()
    assert used._reversed is None and rev == MPI.COMM_NULL, rev  # mpi4py nulls a freed handle
    types = dict(mpi_exchange._TYPES)
    assert types, "no record datatype was made"
    block = fd.StateBlock(2, 3)
    collected = fd.MPIExchange(comm)
    collected.exscan_states(block, True)  # makes its reversed communicator
    rev = collected._reversed
    assert rev is not None and rev != MPI.COMM_NULL, rev
    del collected
    gc.collect()
    assert rev == MPI.COMM_NULL, rev  # freed by __del__
    used.exscan_states(block, True)  # made again
    assert used._reversed is not None
    again = fd.MPIExchange(comm)
    again.allreduce_states(fd.StateBlock(heads=3, size=5))
    assert fd.StateBlock(3, 5).record_bytes in mpi_exchange._TYPES
    assert all(mpi_exchange._TYPES[rb] is t for rb, t in types.items()), "datatypes not shared"
    shared = [mpi_exchange._OP, *mpi_exchange._TYPES.values()]
    mpi_exchange._free_shared()  # what runs at exit while MPI is initialised
    assert mpi_exchange._OP is None and not mpi_exchange._TYPES
    assert shared[0] == MPI.OP_NULL and all(t == MPI.DATATYPE_NULL for t in shared[1:])
    again.exscan_states(block, True)  # made again; at exit MPI is finalised: left to MPI
    MPI.Finalize()
    again.free()  # after MPI_Finalize: nothing to free, no MPI call
    del again
    gc.collect()
    return {"errors": {}}


def main():
    comm = MPI.COMM_WORLD
    lengths = [int(x) for x in sys.argv[1].split(",")]
    if len(lengths) != comm.Get_size():
        raise SystemExit(f"{len(lengths)} lengths for {comm.Get_size()} ranks")
    only = set(sys.argv[3:]) or None
    torch.set_num_threads(1)
    favor.set_num_threads(1)
    exchange = fd.MPIExchange(comm)

    def sum_over_ranks(t):
        a = np.ascontiguousarray(t.detach().numpy())
        out = np.empty_like(a)
        comm.Allreduce(a, out, op=MPI.SUM)
        return torch.from_numpy(out)

    results = run_all(comm.Get_rank(), comm.Get_size(), lengths, exchange, sum_over_ranks,
                      {"exchange": exchange}, only)
    rank = comm.Get_rank()
    if only is None:
        try:
            results["mpi_free"] = free_case(comm, exchange)
        except Exception:  # reported, not raised
            results["mpi_free"] = {"failed": traceback.format_exc()}
    with open(f"{sys.argv[2]}.{rank}.json", "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
