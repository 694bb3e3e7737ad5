"""One rank of test_distributed_gloo.py's torch.distributed runs: joins a gloo group through a
file:// rendezvous (no network port is chosen by hand), runs distributed_cases.run_all and
writes its results as JSON.

python3 distributed_worker.py RANK SIZE LENGTHS INIT_FILE OUT_JSON [CASE ...]
LENGTHS: the slice lengths of the ranks, comma-separated (e.g. 6,0,11).
"""
import json
import os
import sys

import torch
import torch.distributed as dist

import favor
import favor.distributed as fd
from distributed_cases import run_all


def main():
    rank, size = int(sys.argv[1]), int(sys.argv[2])
    lengths = [int(x) for x in sys.argv[3].split(",")]
    init, out = sys.argv[4], sys.argv[5]
    only = set(sys.argv[6:]) or None
    torch.set_num_threads(1)
    favor.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=size)

    def sum_over_ranks(t):
        t = t.clone()
        dist.all_reduce(t)
        return t

    results = run_all(rank, size, lengths, fd.TorchExchange(), sum_over_ranks, {}, only)
    with open(out, "w") as f:
        json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()
    # Leave without the interpreter's teardown: after the barrier and destroy_process_group,
    # gloo's worker threads still aborted a rank at exit now and then ("terminate called
    # without an active exception", SIGABRT, exit code -6; one rank in ~10 runs of ctest -j 2
    # on 2 cores, torch 2.13; pytorch/pytorch#179291 describes the teardown). The results are
    # written and closed above.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
