"""Train a small character model on tinyshakespeare with ONE long sequence per step split
over P processes: each process ("rank") holds a contiguous slice of the sequence, its
attention layers are favor.distributed.attention (causal), and only per-head states cross
between the ranks, whatever the sequence length.

    python examples/distributed/train_split.py --procs 2
    python examples/distributed/train_split.py --procs 2 --steps 2 --check
    torchrun --nproc_per_node 2 examples/distributed/train_split.py
    python examples/distributed/train_split.py --procs 2 --quick     # a smoke test, seconds

(Debian's torchrun 1.13 on Python 3.11 needs --redirects 2 --tee 2 before --nproc_per_node:
its default --redirects 0 parses to None there, since Python 3.11 iterates IntFlag members
without the zero one.) Defaults: 2 layers, d_model 64, 4 heads, 64 features, windows of
4096 characters, 200 steps: ~45 s with 2 ranks on 2 cores (--quick: at most 3 steps, windows
of 1024 characters unless --length is given).

Every rank builds the same model (same seed), reads the same window of `--length` characters
(the step's seed) and computes the loss of its slice: the summed cross-entropy of its
targets divided by the window's length, so that the sum over ranks is the mean loss of the
whole window. After backward every gradient is summed over ranks (all_reduce): each rank
holds its share of every parameter's gradient, the attention maps' included. The replicas
then take identical optimiser steps. --check compares the first step's split loss and summed
gradients with a single process running the whole window through favor.torch.attention.
"""
import argparse
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn import functional as F

import favor
import favor.distributed as fd
import favor.torch as ft
from favor.models.char_transformer import sinusoids
from favor.models.data import CharData

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "shakespeare", "data", "tinyshakespeare.txt")
# The loss and gradients of the split run against the single-process run, relative to the
# largest: float32 rounding of sums reassociated at the slice boundaries through two layers
# (measured ~1e-6); 1e-4 leaves room and still catches a missing or doubled state.
CHECK_TOLERANCE = 1e-4


class Attention(nn.Module):
    """Causal multi-head self-attention with a learned decay per head (gamma =
    sigmoid(logit)), so the map has a parameter whose gradient is a per-rank share too."""

    def __init__(self, d_model, heads, features, seed):
        super().__init__()
        self.heads, self.features, self.seed = heads, features, seed
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.decay_logit = nn.Parameter(torch.full((heads,), 4.0))  # gamma = 0.982

    def forward(self, x, exchange):
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        kw = dict(causal=True, features=self.features, seed=self.seed,
                  decay=torch.sigmoid(self.decay_logit))
        if exchange is None:  # one process, the whole sequence
            y = ft.attention(q, k, v, **kw)
        else:
            y = fd.attention(q, k, v, exchange=exchange, **kw)
        return self.out(y.transpose(1, 2).reshape(b, n, d))


class Block(nn.Module):
    def __init__(self, d_model, heads, features, seed):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = Attention(d_model, heads, features, seed)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(),
                                 nn.Linear(4 * d_model, d_model))

    def forward(self, x, exchange):
        x = x + self.attn(self.norm1(x), exchange)
        return x + self.mlp(self.norm2(x))


class SplitCharModel(nn.Module):
    """Token embeddings + sinusoidal positions from the slice's offset, pre-LN blocks, a
    tied output head. forward(ids [1, n], offset, exchange) -> logits [1, n, vocab]."""

    def __init__(self, vocab, d_model, heads, layers, features):
        super().__init__()
        self.d_model = d_model
        self.tok = nn.Embedding(vocab, d_model)
        nn.init.normal_(self.tok.weight, std=0.02)
        self.blocks = nn.ModuleList(Block(d_model, heads, features, 1000 * i)
                                    for i in range(layers))
        self.norm = nn.LayerNorm(d_model)

    def forward(self, ids, offset, exchange):
        x = self.tok(ids) + sinusoids(offset, ids.shape[1], self.d_model)
        for block in self.blocks:
            x = block(x, exchange)
        return self.norm(x) @ self.tok.weight.t()


def slice_bounds(n, rank, size):
    """[a, b) of rank's contiguous slice of n positions (the first n % size ranks get one
    more)."""
    base, extra = divmod(n, size)
    a = rank * base + min(rank, extra)
    return a, a + base + (rank < extra)


def split_loss(model, x, y, rank, size, exchange):
    """This rank's share of the window's mean cross-entropy."""
    a, b = slice_bounds(x.shape[1], rank, size)
    logits = model(x[:, a:b], a, exchange)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y[:, a:b].reshape(-1),
                           reduction="sum") / x.shape[1]


def sum_gradients(model):
    """Every parameter's gradient summed over ranks (each rank held its share), in one
    all_reduce of the gradients laid end to end."""
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    for g, part in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(part.view_as(g))


def check_first_step(model, x, y, loss, rank):
    """Rank 0: the whole window through favor.torch.attention in one process, against the
    split loss and the summed gradients (already in model's .grad)."""
    if rank != 0:
        return True
    single = SplitCharModel(*model.config)
    single.load_state_dict(model.state_dict())
    ref = F.cross_entropy(single(x, 0, None).reshape(-1, model.config[0]), y.reshape(-1))
    ref.backward()
    loss_diff = abs(loss - ref.item()) / abs(ref.item())
    worst, where = 0.0, ""
    for (name, p), q in zip(model.named_parameters(), single.parameters()):
        d = float((p.grad - q.grad).abs().max() / q.grad.abs().max().clamp_min(1e-30))
        if d > worst:
            worst, where = d, name
    ok = loss_diff <= CHECK_TOLERANCE and worst <= CHECK_TOLERANCE
    print(f"check: split loss {loss:.6f}, single-process {ref.item():.6f} (relative "
          f"difference {loss_diff:.1e}); gradients: largest relative difference {worst:.1e} "
          f"({where}); tolerance {CHECK_TOLERANCE:g}: {'OK' if ok else 'FAILED'}", flush=True)
    return ok


def train(rank, size, args):
    torch.set_num_threads(args.threads)
    favor.set_num_threads(args.threads)
    exchange = fd.TorchExchange()
    data = CharData.from_file(args.data)
    torch.manual_seed(args.seed)  # the same initial model on every rank
    config = (data.vocab, args.d_model, args.heads, args.layers, args.features)
    model = SplitCharModel(*config)
    model.config = config
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    if rank == 0:
        a, b = slice_bounds(args.length, rank, size)
        print(f"seed {args.seed}: {size} ranks, one window of {args.length} characters per "
              f"step ({b - a} on rank 0), {sum(p.numel() for p in model.parameters())} "
              f"parameters, {args.threads} thread(s) per rank", flush=True)
    ok = True
    start = time.perf_counter()
    for step in range(args.steps):
        g = torch.Generator().manual_seed(args.seed * 100003 + step)  # the same on every rank
        x, y = data.batch("train", 1, args.length, g)
        opt.zero_grad(set_to_none=True)
        loss = split_loss(model, x, y, rank, size, exchange)
        loss.backward()
        sum_gradients(model)
        total = loss.detach().clone()
        dist.all_reduce(total)
        if args.check and step == 0:
            ok = check_first_step(model, x, y, total.item(), rank)
        opt.step()
        if rank == 0:
            print(f"step {step + 1:4d}  loss {total.item():.4f}", flush=True)
    if rank == 0:
        fs, bs = exchange.forward_stats, exchange.backward_stats
        print(f"per attention call and rank: forward {fs.payload_bytes} bytes of states in "
              f"{fs.collectives} collectives, backward {bs.payload_bytes} bytes in "
              f"{bs.collectives} (any window length)", flush=True)
    checksum = torch.stack([p.detach().double().sum() for p in model.parameters()]).sum()
    sums = [torch.zeros_like(checksum) for _ in range(size)]
    dist.all_gather(sums, checksum)
    if rank == 0:
        same = all(bool(s == sums[0]) for s in sums)
        print(f"{args.steps} steps in {time.perf_counter() - start:.1f} s; replicas "
              f"{'identical' if same else 'DIFFER'}", flush=True)
        ok = ok and same
    return ok


def shutdown(finished):
    """Destroys the group; after a finished run every rank first meets at a barrier: a rank
    that tore its gloo connections down while a peer's last isend to it was still in flight
    made that peer abort at exit ("terminate called without an active exception", SIGABRT;
    seen under load with torch 2.13). After an exception there is no barrier: the peers'
    pending collectives then fail at once instead of waiting for it."""
    try:
        if finished:
            dist.barrier()
    finally:
        dist.destroy_process_group()


def run_rank(rank, size, args):
    """Trains as one rank of the group already initialised, then leaves the process without
    the interpreter's teardown: even after the barrier and destroy_process_group, gloo's
    worker threads still aborted a rank at exit now and then ("terminate called without an
    active exception", SIGABRT; 3 of ~30 runs in CI-like conditions, torch 2.13, spawned and
    under torchrun alike; pytorch/pytorch#179291 describes the teardown). Everything this rank
    had to say is printed and flushed first."""
    finished = False
    try:
        ok = train(rank, size, args)
        finished = True
    finally:
        shutdown(finished)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if ok else 1)


def spawned(rank, size, init_file, args):
    """A process started by --procs: joins the group through a file:// rendezvous."""
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank,
                            world_size=size)
    run_rank(rank, size, args)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--procs", type=int, default=2, help="processes to spawn (ignored under "
                   "torchrun, which sets the ranks)")
    p.add_argument("--steps", type=int, default=200, help="training steps (--quick: at most 3)")
    p.add_argument("--length", type=int, default=None,
                   help="characters per window, split over the ranks (default 4096; --quick: 1024)")
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="threads per rank")
    p.add_argument("--data", default=DATA)
    p.add_argument("--check", action="store_true", help="compare the first step with a "
                   "single process (loss and gradients); exit 1 if they differ")
    p.add_argument("--quick", action="store_true",
                   help="a smoke test of the command line: at most 3 steps, short windows")
    args = p.parse_args(argv)
    if args.quick:
        args.steps = min(args.steps, 3)
    if args.length is None:
        args.length = 1024 if args.quick else 4096
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun
        dist.init_process_group("gloo")
        run_rank(dist.get_rank(), dist.get_world_size(), args)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            mp.spawn(spawned, args=(args.procs, os.path.join(tmp, "rendezvous"), args),
                     nprocs=args.procs)
        except mp.ProcessExitedException as e:
            print(f"train_split: {e}", file=sys.stderr)
            sys.exit(1)


if __name__ == "__main__":
    main()
