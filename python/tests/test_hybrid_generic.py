"""Hybrid attention's torch kernel (favor/ops/hybrid/chunk.py: exact softmax on a window
and sink tokens, the estimator elsewhere, one normaliser) against its float64 oracle
(favor/ops/hybrid/naive.py, materialised), on CPU tensors.

Tolerance (docs/numerics.md, rule 1, as test_torch_path.py): the float32 result's relative
Frobenius error against the float64 oracle is at most twice that of the oracle evaluated
naively in float32 plus 1e-6; gradients likewise against float64 autograd through the oracle.
"""
import pytest
import torch

import favor
from favor.ops.attention import fit_tensors, generic
from favor.ops.hybrid import chunk as hybrid
from favor.ops.hybrid import naive
from favor.ops.attention.canonical import TRIG, canonical_map
from favor.ops.exact.naive import softmax_attention
from torch_helpers import frob, seeded_qkv

B, H, D, DV, M, CHUNK = 2, 2, 16, 5, 32, 16


def projection(seed):
    return torch.tensor(favor.make_projection(D, "orthogonal", features=M, seed=seed).matrix)


def keep_mask(n):
    """keep [B, N]: row 0 loses its tail, row 1 its first n // 3 keys (left padding: its
    sinks are the keys after the padding)."""
    keep = torch.ones(B, n, dtype=torch.bool)
    keep[0, n - n // 4:] = False
    keep[1, :n // 3] = False
    return keep


def map_tensors(kernel, learned, causal, seed):
    """(w, weights, bias, lambda, decay): a drawn projection, and for a learned map per-head
    tensors moved off their start, with a per-head decay when causal."""
    g = torch.Generator().manual_seed(100 + seed)
    w = projection(seed)
    if not learned:
        return w, None, None, None, None
    decay = torch.tensor([0.9, 0.97], dtype=torch.float64) if causal else None
    return (w, w + torch.randn(H, M, D, generator=g) * 0.1, torch.randn(H, M, generator=g) * 0.1,
            torch.rand(H, M, generator=g) + 0.5, decay)


def run_generic(q, k, v, kernel, w, wt, bias, lam, decay, keep, causal, window, sinks,
                fit=None):
    """hybrid.hybrid_attention on [B, H, N, *] tensors (heads flattened), float32 out."""
    fit_a, fit_basis = (None, None) if fit is None else fit_tensors(fit, kernel, D, (B, H))
    cm = canonical_map(w, wt, bias, lam, decay, fit_a, fit_basis, kernel, None, D)
    flat = lambda t: t.reshape(-1, *t.shape[2:])  # noqa: E731
    y = hybrid.hybrid_attention(flat(q), flat(k), flat(v), cm, keep.repeat_interleave(H, 0),
                                causal, window, sinks, CHUNK, scale=D ** -0.5,
                                log_const=hybrid.pair_log_const(kernel, M, fit_a))
    return y.reshape(*q.shape[:-1], DV)


def run_oracle(q, k, v, kernel, w, wt, bias, lam, decay, keep, causal, window, sinks,
               fit=None):
    return naive.hybrid_attention(q, k, v, wt if wt is not None else w, kernel, causal, None,
                                  keep, fit, bias, lam, decay, window, sinks)


CASES = [  # (kernel, learned map, causal, window, sinks, N)
    ("positive", False, True, 5, 2, 37), ("positive", False, False, 4, 2, 37),
    ("positive", False, True, 0, 3, 37), ("positive", False, False, 0, 3, 37),
    ("positive", False, True, 6, 0, 37), ("positive", False, False, 6, 0, 37),
    ("positive", False, True, 1, 1, 40), ("trig", False, True, 5, 2, 37),
    ("trig", False, False, 4, 3, 37), ("hyperbolic", False, True, 3, 1, 33),
    ("favorsharp", False, False, 4, 2, 29), ("positive", True, True, 5, 2, 37),
    ("positive", True, True, 0, 2, 37), ("hedgehog", True, True, 4, 4, 37),
    ("hedgehog", True, False, 3, 2, 29),
]


@pytest.mark.parametrize("kernel,learned,causal,window,sinks,n", CASES)
def test_hybrid_matches_oracle(kernel, learned, causal, window, sinks, n):
    q, k, v = seeded_qkv(B, H, n, D, DV, seed=n + window)
    keep = keep_mask(n)
    maps = map_tensors(kernel, learned, causal, n)
    fit = favor.fit_kernel(kernel, (q * 1.1).numpy(), (k * 0.9).numpy()) \
        if kernel == "favorsharp" else None
    args = (kernel, *maps, keep, causal, window, sinks, fit)
    y = run_generic(q, k, v, *args)
    c = lambda t: None if t is None else t.to(torch.float64)  # noqa: E731
    ref = run_oracle(c(q), c(k), c(v), kernel, *(c(t) for t in maps), *args[-5:])
    naive32 = run_oracle(q, k, v, *args)
    assert torch.isfinite(y).all()
    assert frob(y, ref) <= 2 * frob(naive32, ref) + 1e-6
    # rows with no visible key are zeros (row 1's first query, causal)
    if causal:
        assert torch.all(y[1, :, 0] == 0)


@pytest.mark.parametrize("causal", [True, False])
def test_window_covering_everything_is_softmax(causal):
    """window >= N: exact softmax (the float64 textbook formula), whatever the sinks."""
    n = 30
    q, k, v = seeded_qkv(B, H, n, D, DV, seed=4)
    keep = keep_mask(n)
    sm = lambda *t: softmax_attention(*t, causal=causal, keep=keep)  # noqa: E731
    ref, naive32 = sm(q.double(), k.double(), v.double()), sm(q, k, v)
    for window, sinks in ((n, 0), (n + 7, 3)):
        maps = map_tensors("positive", False, causal, 1)
        y = run_generic(q, k, v, "positive", *maps, keep, causal, window, sinks)
        assert frob(y, ref) <= 2 * frob(naive32, ref) + 1e-6
        c = lambda t: None if t is None else t.double()  # noqa: E731
        oracle = run_oracle(q.double(), k.double(), v.double(), "positive",
                            *(c(t) for t in maps), keep, causal, window, sinks)
        assert torch.allclose(oracle, ref, rtol=1e-12, atol=1e-12)


GRAD_CASES = [  # (kernel, learned map, causal, window, sinks)
    ("positive", False, False, 4, 2), ("positive", False, True, 0, 3),
    ("positive", True, True, 5, 2), ("trig", False, True, 5, 2),
    ("hedgehog", True, False, 3, 0), ("hedgehog", True, True, 3, 1),
]


@pytest.mark.parametrize("kernel,learned,causal,window,sinks", GRAD_CASES)
def test_hybrid_gradients(kernel, learned, causal, window, sinks):
    """Gradients of q, k, v and the learned tensors (weights, bias, lambda, decay) by
    autograd through the torch kernel, against float64 autograd through the oracle."""
    n = 37
    q, k, v = seeded_qkv(B, H, n, D, DV, seed=3)
    keep = keep_mask(n)
    w, *maps = map_tensors(kernel, learned, causal, 2)
    names = [x for x, t in zip(["q", "k", "v", "weights", "bias", "lambda", "decay"],
                               [q, k, v, *maps]) if t is not None]
    dy = torch.randn(B, H, n, DV, generator=torch.Generator().manual_seed(9))

    def grads(fn, dtype):
        # gamma stays float64, as favor takes it (the float32 oracle rounds it itself)
        xs = [None if t is None else t.detach().to(torch.float64 if t is maps[3] else dtype)
              .requires_grad_() for t in (q, k, v, *maps)]
        y = fn(*xs[:3], kernel, w.to(dtype), *xs[3:], keep, causal, window, sinks)
        return torch.autograd.grad(y, [x for x in xs if x is not None], dy.to(dtype))

    got = grads(run_generic, torch.float32)
    ref, naive32 = grads(run_oracle, torch.float64), grads(run_oracle, torch.float32)
    for name, g, r, gn in zip(names, got, ref, naive32):
        if kernel == "trig" and name == "bias":
            continue  # cos(a_q - a_k): the bias cancels, its gradient is rounding noise
        assert frob(g, r) <= 2 * frob(gn, r) + 1e-6, name


@pytest.mark.parametrize("causal", [True, False])
def test_linear_core_row_scales(causal):
    """linear_core(with_scale=True): e^(L_i) out_i is the unstabilised sum over the keys row i
    sees, and out is the call without with_scale, bit for bit."""
    n = 21
    q, k, v = (t[0] for t in seeded_qkv(1, H, n, D, DV, seed=8))
    keep = keep_mask(n)[:1].expand(H, n)
    cm = canonical_map(projection(0), None, None, None, None, None, None, "positive", None, D)
    phi, scale = generic.key_features(k, cm, keep, causal)
    lq = generic.query_logits(q, cm)
    vx = torch.cat([v, torch.ones_like(v[..., :1])], -1)
    out, lse = generic.linear_core(lq, cm.kind != TRIG, phi, scale, vx, causal, DV, 8, True)
    assert torch.equal(out, generic.linear_core(lq, True, phi, scale, vx, causal, DV, 8))
    # the same sums in float64, unstabilised: exp(lq_i) . exp(l_j) over the visible j
    keys = phi.double() * torch.exp(scale.masked_fill(torch.isinf(scale), 0.0)).unsqueeze(-1)
    big = torch.exp(lq.double()) @ keys.transpose(-1, -2)
    if causal:
        big = big.tril()
    ref = big @ vx.double()
    got = torch.exp(lse).unsqueeze(-1) * out.double()
    seen = torch.isfinite(lse)
    assert frob(got[seen], ref[seen]) < 1e-6
    assert torch.all(ref[~seen] == 0)
