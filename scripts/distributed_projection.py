#!/usr/bin/env python3
"""Projects the time per attention layer of sequence-parallel FAVOR attention on a cluster
(docs/distributed.md): every rank holds N / P tokens of every head, computes its key states
(keys only), joins one scan (causal) or allreduce (bidirectional) of the per-head states, and
attends its queries. Backward adds a second scan / allreduce of the query-side sums.

Model, per layer and rank (all assumptions are arguments):
  compute  = flops(N / P) / rate, flops from bench/cost_model.hpp (favor_flops,
             favor_backward_flops), rate = the sustained rate of one node;
  a scan or allreduce of M bytes over P ranks = ceil(log2 P) steps of (alpha + M / beta)
             (recursive doubling; MPI's Exscan and small-message Allreduce), M = B H (F (Dv + 1)
             x 4 + 32) bytes (the StateBlock records);
  forward  = key pass (0.43 of a causal sweep over the slice, measured: favor_causal.cpp) +
             one collective + the sweep; backward = the backward flops + two collectives.
The key pass and the sweep are not overlapped with the collective (the sweep needs its result).

Defaults: a node of 64 cores at this machine's measured per-core rates (favor bench
--sections distributed, P = 1 on 2 cores: causal forward 144.9 GFLOP/s, backward 128.6 GFLOP/s,
so 4640 and 4115 GFLOP/s per node), InfiniBand HDR (alpha 2 us, 25 GB/s).

Usage: scripts/distributed_projection.py [--rate-gflops 4640] [--backward-rate-gflops 4115]
                                         [--alpha-us 2] [--beta-gbs 25]
"""
import argparse
import math


def favor_flops(bh, n, d, dv, m, f, causal, chunk=64):
    per_head = 4.0 * n * d * m + 2.0 * n * f * dv + 2.0 * n * f * (dv + 1)
    intra = 2.0 * n * chunk * (f + dv) if causal else 0.0
    return bh * (per_head + intra)


def favor_backward_flops(bh, n, d, dv, m, f, causal, chunk=64):
    dm, fv = d * m, f * (dv + 1)
    if causal:
        per_head = n * (12.0 * dm + 10.0 * fv + 2.0 * chunk * (4.0 * f + 3.0 * (dv + 1)))
    else:
        per_head = n * (10.0 * dm + 12.0 * fv)
    return bh * per_head


def collective_s(ranks, bytes_, alpha_s, beta_bps):
    steps = math.ceil(math.log2(ranks)) if ranks > 1 else 0
    return steps * (alpha_s + bytes_ / beta_bps)


def project(n, ranks, a):
    bh, d, dv, m = a.batch * a.heads, a.d, a.dv, a.m
    f = m
    local = n / ranks
    rate, backward_rate = a.rate_gflops * 1e9, a.backward_rate_gflops * 1e9
    sweep = favor_flops(bh, local, d, dv, m, f, True) / rate
    keys = 0.43 * sweep
    state_bytes = bh * (f * (dv + 1) * 4 + 32)
    comm = collective_s(ranks, state_bytes, a.alpha_us * 1e-6, a.beta_gbs * 1e9)
    forward = keys + comm + sweep
    backward = favor_backward_flops(bh, local, d, dv, m, f, True) / backward_rate + keys + 2 * comm
    return forward, backward, comm, state_bytes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate-gflops", type=float, default=4640.0,
                    help="sustained causal FAVOR forward rate of one node (GFLOP/s)")
    ap.add_argument("--backward-rate-gflops", type=float, default=4115.0,
                    help="sustained causal FAVOR backward rate of one node (GFLOP/s)")
    ap.add_argument("--alpha-us", type=float, default=2.0, help="per-message latency (us)")
    ap.add_argument("--beta-gbs", type=float, default=25.0, help="link bandwidth (GB/s)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--dv", type=int, default=64)
    ap.add_argument("--m", type=int, default=256)
    a = ap.parse_args()
    print(f"# causal FAVOR+, B={a.batch} H={a.heads} D={a.d} Dv={a.dv} m={a.m}; node "
          f"{a.rate_gflops:g} / {a.backward_rate_gflops:g} GFLOP/s (forward / backward), "
          f"alpha {a.alpha_us:g} us, beta {a.beta_gbs:g} GB/s")
    print("| tokens N | nodes P | tokens per node | forward ms | comm ms (share) | "
          "forward+backward ms | state per collective |")
    print("|---|---|---|---|---|---|---|")
    for n in (1 << 20, 10 << 20, 100 << 20):
        for ranks in (8, 64, 1024):
            fwd, bwd, comm, state = project(n, ranks, a)
            print(f"| {n / 2**20:g}M | {ranks} | {n // ranks:,} | {fwd * 1e3:.3f} | "
                  f"{comm * 1e3:.3f} ({comm / fwd:.0%}) | {(fwd + bwd) * 1e3:.3f} | "
                  f"{state / 1024:.0f} KiB |")


if __name__ == "__main__":
    main()
