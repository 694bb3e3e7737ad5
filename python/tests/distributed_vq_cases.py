"""The Transformer-VQ cases of test_distributed_gloo.py and test_distributed_mpi.py, run
inside every rank by the workers through distributed_cases.run_all (torch.distributed with
gloo, and mpirun with mpi4py).

Each case draws the whole sequence and a codebook (fixed seeds, the same on every rank), runs
single-process favor.torch.vq_attention on it as the reference, then
favor.distributed.vq_attention on this rank's slice, and reports the largest relative error
(max |got - ref| / max |ref|) of this rank's output slice, of its dq, dk, dv slices and of the
codebook gradient summed over ranks. Keys lie near their codes, far from any tie between the
two nearest (hard VQ assigns a near-tie by rounding, which may differ between the slice and
the whole sequence; tests/test_vq_sequence_parallel.cpp says more).
"""
import torch

import favor.distributed as fd
import favor.torch as ft

B, H, D, DV, C = 2, 2, 8, 6, 5


def _rel(got, ref):
    got, ref = got.detach().double(), ref.detach().double()
    assert got.shape == ref.shape, (got.shape, ref.shape)
    if ref.numel() == 0:
        return 0.0
    return float((got - ref).abs().max() / max(float(ref.abs().max()), 1e-30))


def _inputs(n, opts):
    """q, k, v, dy [B, H, n, *] (or [n, *] with rank2), the key_padding_mask [B, n] (True =
    ignore) and the codebook [H, C, D] (or [C, D] when shared)."""
    g = torch.Generator().manual_seed(opts.get("seed", 0))
    shared = opts.get("shared", False) or opts.get("rank2", False)
    book = torch.randn(1 if shared else H, C, D, generator=g)
    z = torch.randint(0, C, (B, H, n), generator=g)
    heads = torch.zeros(B, H, n, dtype=torch.long) if shared else \
        torch.arange(H).view(1, H, 1).expand(B, H, n)
    k = book[heads, z] + 0.35 * torch.randn(B, H, n, D, generator=g)
    q = 0.6 * torch.randn(B, H, n, D, generator=g)
    v = torch.randn(B, H, n, DV, generator=g)
    dy = torch.randn(B, H, n, DV, generator=g)
    mask = torch.rand(B, n, generator=g) < 0.3
    mask[1] = False
    dist = ((k.double().unsqueeze(-2) - book.double()[heads]) ** 2).sum(-1)  # [B, H, n, C]
    two = dist.topk(2, dim=-1, largest=False).values
    assert float((two[..., 1] - two[..., 0]).min()) > 0.1, "a near-tie: pick another seed"
    if opts.get("rank2", False):
        q, k, v, dy = (t[0, 0] for t in (q, k, v, dy))
    return q, k, v, dy, mask, book[0] if shared else book


def vq_case(opts, rank, lengths, sum_over_ranks, exchange_kw):
    """The errors of this rank's slice against single-process favor.torch.vq_attention."""
    n = sum(lengths)
    a = sum(lengths[:rank])
    b = a + lengths[rank]
    q, k, v, dy, mask, book = _inputs(n, opts)
    dtype = opts.get("dtype", torch.float32)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    kw = dict(causal=opts.get("causal", False), tau=opts.get("tau", 0.0))
    masked = opts.get("mask", False)
    rank2 = opts.get("rank2", False)
    sl = (lambda t: t[a:b]) if rank2 else (lambda t: t[:, :, a:b])

    ref_in = [t.clone().requires_grad_() for t in (q, k, v, book)]
    y = ft.vq_attention(*ref_in, key_padding_mask=mask if masked else None, **kw)
    (y * dy).sum().backward()

    mine = [sl(t.detach()).requires_grad_() for t in (q, k, v)]
    my_book = book.clone().requires_grad_()
    ys = fd.vq_attention(*mine, my_book, key_padding_mask=mask[:, a:b] if masked else None,
                         block=opts.get("block", {}).get(rank), **kw, **exchange_kw)
    (ys * sl(dy)).sum().backward()

    assert ys.dtype == dtype
    errors = {"y": _rel(ys, sl(y))}
    for name, got, ref in zip(("dq", "dk", "dv"), mine, ref_in):
        errors[name] = _rel(got.grad, sl(ref.grad))
    errors["dcodebook"] = _rel(sum_over_ranks(my_book.grad), ref_in[3].grad)
    return {"errors": errors}


# name -> options of vq_case (block: per-rank causal block lengths; None: favor's default)
VQ_CASES = {
    "vq_hard": dict(seed=30),
    "vq_hard_causal_mask": dict(causal=True, mask=True, seed=31),
    "vq_soft_mask_shared": dict(tau=6.0, mask=True, shared=True, seed=32),
    "vq_soft_causal_blocks": dict(tau=6.0, causal=True, block={0: 2, 1: 3, 2: 5}, seed=33),
    "vq_hard_mask": dict(mask=True, seed=34),
    "vq_rank2_float64_causal": dict(rank2=True, dtype=torch.float64, causal=True, seed=35),
}


def vq_error_case(name, rank, size, lengths, exchange_kw):
    """The last rank breaks a rule; every rank must raise the same ValueError (favor.Error),
    also when the last rank's own error is a TypeError found before the C++ call."""
    n = sum(lengths)
    a = sum(lengths[:rank])
    b = a + lengths[rank]
    q, k, v, _, mask, book = _inputs(n, dict(seed=36))
    q, k, v = (t[:, :, a:b] for t in (q, k, v))
    keep = mask[:, a:b]
    causal = False
    if rank == size - 1:
        if name == "python_error":  # refused by favor.distributed before the C++ call
            keep = keep.to(torch.int64)
        elif name == "binding_error":  # refused by the binding before the C++ call
            keep = keep[:, :0] if keep.shape[1] else torch.zeros(B, 1, dtype=torch.bool)
        elif name == "codebook_mismatch":  # valid on its own, not with the others
            book = book + 1e-3
        elif name == "type_error":  # a TypeError in Python before the call
            causal = "yes"
    try:
        fd.vq_attention(q, k, v, book, key_padding_mask=keep, causal=causal, **exchange_kw)
    except ValueError as e:
        cause = e.__cause__
        return {"raised": type(e).__name__, "message": str(e),
                "cause": None if cause is None else type(cause).__name__}
    return {"raised": None}


VQ_ERROR_CASES = ("python_error", "binding_error", "codebook_mismatch", "type_error")
