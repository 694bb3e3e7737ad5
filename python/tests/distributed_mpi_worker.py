"""One rank of test_distributed.py's mpirun run: favor.distributed over mpi4py
(MPIExchange), distributed_cases.run_all, results as JSON (OUT_PREFIX.RANK.json).

mpirun -np P python3 distributed_mpi_worker.py LENGTHS OUT_PREFIX [CASE ...]
"""
import json
import sys

import numpy as np
import torch
from mpi4py import MPI

import favor
import favor.distributed as fd
from distributed_cases import run_all


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
    with open(f"{sys.argv[2]}.{comm.Get_rank()}.json", "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
