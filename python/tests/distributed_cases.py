"""The cases of test_distributed_gloo.py and test_distributed_mpi.py, run inside every rank
by distributed_worker.py (torch.distributed, gloo) and distributed_mpi_worker.py (mpirun,
mpi4py); the Transformer-VQ ones are in distributed_vq_cases.py.

Each attention case draws the whole sequence (fixed seeds, the same on every rank), runs
single-process favor.torch.attention on it as the reference, then favor.distributed.attention
on this rank's slice, and reports the largest relative error (max |got - ref| / max |ref|) of
this rank's output slice, of its dq, dk, dv slices and of the parameter gradients summed over
ranks. Error cases report the exception every rank raised. Results are JSON-able dicts.
"""
import traceback

import numpy as np
import torch

import favor
import favor.distributed as fd
import favor.torch as ft
from distributed_vq_cases import VQ_CASES, VQ_ERROR_CASES, vq_case, vq_error_case

B, H, D, DV, M = 2, 2, 8, 6, 16


def _rel(got, ref):
    got = np.asarray(got.detach() if isinstance(got, torch.Tensor) else got, np.float64)
    ref = np.asarray(ref.detach() if isinstance(ref, torch.Tensor) else ref, np.float64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    if ref.size == 0:
        return 0.0
    return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))


def _inputs(n, seed, rank2=False):
    g = torch.Generator().manual_seed(seed)
    shape = (n, D) if rank2 else (B, H, n, D)
    q = torch.randn(*shape, generator=g) * 0.6
    k = torch.randn(*shape, generator=g) * 0.6
    v = torch.randn(*shape[:-1], DV, generator=g)
    dy = torch.randn(*shape[:-1], DV, generator=g)
    mask = torch.rand(B, n, generator=g) < 0.3  # True = ignore the key
    mask[1] = False
    return q, k, v, dy, mask


def _parameters(opts, seed):
    """The map's parameter tensors of a case (keyword -> tensor), fresh leaves."""
    g = torch.Generator().manual_seed(seed + 100)
    p = {}
    learn = opts.get("learn", ())
    if "weights" in learn:
        w = favor.FeatureMap.hedgehog(M, D, heads=H, seed=3).weights
        p["weights"] = torch.from_numpy(w) + 0.1 * torch.randn(H, M, D, generator=g)
    if "bias" in learn:
        p["bias"] = 0.2 * torch.randn(H, M, generator=g)
    if "feature_weights" in learn:
        p["feature_weights"] = 1.0 + 0.3 * torch.rand(H, M, generator=g)
    if "projection" in learn:
        p["projection"] = torch.randn(M, D, generator=g)
    if "decay" in learn:
        p["decay"] = torch.tensor([0.9, 0.97])
    return {name: t.requires_grad_() for name, t in p.items()}


def _options(opts, full_q, full_k):
    kw = dict(causal=opts.get("causal", False), kernel=opts.get("kernel", "positive"),
              features=M, seed=3)
    if opts.get("fit") == "calibrated":
        kw["fit"] = favor.fit_kernel(kw["kernel"], (full_q * 1.1 + 0.05).detach().numpy(),
                                     (full_k * 0.9 - 0.05).detach().numpy())
    elif opts.get("fit") is not None:
        kw["fit"] = opts["fit"]
    if "decay" in opts:
        kw["decay"] = opts["decay"]
    return kw


def attention_case(opts, rank, lengths, sum_over_ranks, exchange_kw):
    """The errors of this rank's slice against single-process favor.torch.attention."""
    n = sum(lengths)
    a = sum(lengths[:rank])
    b = a + lengths[rank]
    rank2 = opts.get("rank2", False)
    q, k, v, dy, mask = _inputs(n, opts.get("seed", 0), rank2)
    dtype = opts.get("dtype", torch.float32)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    kw = _options(opts, q, k)
    masked = opts.get("mask", False)

    ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_params = _parameters(opts, opts.get("seed", 0))
    y = ft.attention(*ref_in, key_padding_mask=mask if masked else None, **kw, **ref_params)
    (y * dy).sum().backward()

    def part(t):
        s = t.detach()[a:b] if rank2 else t.detach()[:, :, a:b]
        if opts.get("strided") and not rank2:  # a non-contiguous leaf: [B, N, H, D] transposed
            s = s.transpose(1, 2).contiguous().transpose(1, 2)
        return s.requires_grad_()

    mine = [part(t) for t in (q, k, v)]
    params = _parameters(opts, opts.get("seed", 0))
    ys = fd.attention(*mine, key_padding_mask=mask[:, a:b] if masked else None, **kw, **params,
                      **exchange_kw)
    (ys * (dy[a:b] if rank2 else dy[:, :, a:b])).sum().backward()

    sl = (lambda t: t[a:b]) if rank2 else (lambda t: t[:, :, a:b])
    errors = {"y": _rel(ys, sl(y))}
    assert ys.dtype == dtype
    for name, got, ref in zip(("dq", "dk", "dv"), mine, ref_in):
        errors[name] = _rel(got.grad, sl(ref.grad))
    for name, t in params.items():
        errors["d" + name] = _rel(sum_over_ranks(t.grad), ref_params[name].grad)
    return {"errors": errors}


# name -> options of attention_case
ATTENTION_CASES = {
    "positive": dict(),
    "positive_causal": dict(causal=True),
    "trig": dict(kernel="trig", seed=14),
    "trig_causal": dict(kernel="trig", causal=True),
    "hyperbolic": dict(kernel="hyperbolic", seed=1),
    "mask": dict(mask=True, seed=2),
    "mask_causal": dict(mask=True, causal=True, seed=2),
    "favorpp_fit_over_ranks": dict(kernel="favorpp", seed=4),
    "favorsharp_fit_over_ranks": dict(kernel="favorsharp", seed=5),
    "favorsharp_causal_calibrated": dict(kernel="favorsharp", causal=True, fit="calibrated"),
    "favorpp_causal_constant_fit": dict(kernel="favorpp", causal=True, fit=0.1),
    "hedgehog_learned": dict(kernel="hedgehog", learn=("weights", "bias"), seed=6),
    "hedgehog_learned_causal": dict(kernel="hedgehog", causal=True, learn=("weights", "bias"),
                                    mask=True, seed=7),
    "positive_feature_weights": dict(learn=("feature_weights",), seed=8),
    "projection_grad": dict(learn=("projection",), seed=9),
    "decay_causal": dict(causal=True, decay=[0.9, 0.8], seed=10),
    "decay_learned_causal": dict(kernel="hedgehog", causal=True, learn=("weights", "decay"),
                                 seed=11),
    "float64_strided": dict(dtype=torch.float64, strided=True, causal=True, seed=12),
    "rank2": dict(rank2=True, seed=13),
}


def error_case(name, rank, size, lengths, exchange_kw):
    """The last rank breaks a rule; every rank must raise the same ValueError (favor.Error),
    also when the last rank's own error is another exception (a TypeError, an IndexError, a
    RuntimeError in the backward) found before the C++ call, where the other ranks wait."""
    n = sum(lengths)
    a = sum(lengths[:rank])
    b = a + lengths[rank]
    q, k, v, _, mask = _inputs(n, 20)
    q, k, v = (t[:, :, a:b] for t in (q, k, v))
    kw = dict(features=M, seed=3)
    keep = mask[:, a:b]
    last = rank == size - 1
    if last:
        if name == "shape_mismatch":  # valid on its own, not with the others
            q, k = q[..., :-1], k[..., :-1]
        elif name == "invalid_slice":  # refused by the C++ validation of this rank
            k = k[..., :-1]
        elif name == "option_mismatch":
            kw["seed"] = 4
        elif name == "python_error":  # refused by favor.distributed before the C++ call
            keep = keep.to(torch.int64)
        elif name == "binding_error":  # refused by the binding before the C++ call
            keep = keep[:, :0] if keep.shape[1] else torch.zeros(B, 1, dtype=torch.bool)
        elif name == "causal_mismatch":
            kw["causal"] = True
        elif name == "type_error":  # a TypeError in Python before the call
            kw["causal"] = "yes"
        elif name == "index_error":  # a 0-d tensor: an IndexError in Python before the call
            q = q.sum()
    try:
        if name == "backward_inplace":  # every forward succeeds; the last backward cannot
            k = k.clone().requires_grad_()
            k_used = k * 1.0  # saved by the forward
            y = fd.attention(q, k_used, v, key_padding_mask=keep, **kw, **exchange_kw)
            if last:
                k_used.add_(1.0)  # saved_tensors raises a RuntimeError in its backward
            y.sum().backward()
        else:
            fd.attention(q, k, v, key_padding_mask=keep, **kw, **exchange_kw)
    except ValueError as e:
        cause = e.__cause__
        return {"raised": type(e).__name__, "message": str(e),
                "cause": None if cause is None else type(cause).__name__}
    return {"raised": None}


ERROR_CASES = ("shape_mismatch", "invalid_slice", "option_mismatch", "python_error",
               "binding_error", "causal_mismatch", "type_error", "index_error",
               "backward_inplace")


def _random_block(rank, heads, size, distance, seed):
    """A StateBlock with random records (seeded by rank), some empty."""
    rng = np.random.default_rng(seed * 1000 + rank)
    blk = fd.StateBlock(heads, size, distance)
    rb = blk.record_bytes
    raw = blk.bytes
    for h in range(heads):
        rec = raw[h * rb:(h + 1) * rb]
        header = rec[:32].view(np.float64)
        values = rec[32:32 + 4 * size * (2 if distance else 1)].view(np.float32)
        if rng.random() < 0.2:
            continue  # an empty record
        header[0] = rng.normal() * 3  # max
        header[1] = float(rng.integers(0, 9))  # length
        values[:] = rng.standard_normal(values.size).astype(np.float32)
    return blk


def _sequential(blocks, rb):
    acc = blocks[0].bytes.copy()
    for blk in blocks[1:]:
        later = blk.bytes.copy()
        fd.combine_states(acc, later, rb)
        acc = later
    return acc


def _records_close(got, want, heads, size, distance):
    """Largest relative difference of the records' values after bringing both to the same
    max; the headers (max, length) must match."""
    rb = len(got) // heads
    worst = 0.0
    for h in range(heads):
        g, w = got[h * rb:(h + 1) * rb], want[h * rb:(h + 1) * rb]
        hg, hw = g[:16].view(np.float64), w[:16].view(np.float64)
        assert np.allclose(hg, hw, rtol=1e-12, atol=0) or (np.isinf(hg[0]) and np.isinf(hw[0])), \
            (hg, hw)
        n = size * (2 if distance else 1)
        vg, vw = g[32:32 + 4 * n].view(np.float32), w[32:32 + 4 * n].view(np.float32)
        worst = max(worst, _rel(vg, vw) if np.abs(vw).max() > 0 else float(np.abs(vg).max()))
    return worst


def exchange_case(exchange, rank, size):
    """The exchange's collectives against local evaluation of their definitions."""
    errors = {}
    got = exchange.allgather(np.array([rank, 10 * rank], dtype=np.int64))
    assert list(got) == [x for r in range(size) for x in (r, 10 * r)], got
    assert exchange.allgather_text("é" * rank) == ["é" * r for r in range(size)]
    a = np.full(4, rank + 1.0)
    r = exchange.allreduce_sum(a)
    a = a if r is None else r
    assert np.all(a == size * (size + 1) / 2), a
    for distance in (False, True):
        heads, length = 3, 5
        blocks = [_random_block(r, heads, length, distance, 1) for r in range(size)]
        rb = blocks[0].record_bytes
        mine = _random_block(rank, heads, length, distance, 1)
        exchange.allreduce_states(mine)
        errors[f"allreduce_{distance}"] = _records_close(
            mine.bytes, _sequential(blocks, rb), heads, length, distance)
        for reverse in (False, True):
            mine = _random_block(rank, heads, length, distance, 1)
            exchange.exscan_states(mine, reverse)
            before = blocks[rank + 1:][::-1] if reverse else blocks[:rank]
            empty = fd.StateBlock(heads, length, distance)
            want = _sequential([empty] + before, rb)
            errors[f"exscan_{distance}_{reverse}"] = _records_close(
                mine.bytes, want, heads, length, distance)
    return {"errors": errors}


def run_all(rank, size, lengths, exchange, sum_over_ranks, exchange_kw, only=None):
    """Every case (or those named in `only`), each caught: name -> result dict. exchange
    runs the collectives' own case; exchange_kw ({"exchange": ...} or {} for the default
    process group) goes to favor.distributed.attention."""
    results = {}
    cases = [("exchange", lambda: exchange_case(exchange, rank, size))]
    cases += [(name, (lambda o=o: attention_case(o, rank, lengths, sum_over_ranks,
                                                 exchange_kw)))
              for name, o in ATTENTION_CASES.items()]
    cases += [(f"error_{name}", (lambda n=name: error_case(n, rank, size, lengths,
                                                           exchange_kw)))
              for name in ERROR_CASES]
    cases += [(name, (lambda o=o: vq_case(o, rank, lengths, sum_over_ranks, exchange_kw)))
              for name, o in VQ_CASES.items()]
    cases += [(f"vq_error_{name}", (lambda n=name: vq_error_case(n, rank, size, lengths,
                                                                 exchange_kw)))
              for name in VQ_ERROR_CASES]
    for name, run in cases:
        if only is not None and name not in only:
            continue
        try:
            results[name] = run()
        except Exception:  # reported, not raised: the other cases still run
            results[name] = {"failed": traceback.format_exc()}
    return results
