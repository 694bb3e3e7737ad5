"""Shared pieces of the learned-feature-map tests (test_feature_maps.py,
test_feature_map_torch.py): seeded learned maps and the plain-torch oracle
(favor.torch.plain.attention_materialised with weights, bias, lambda and decay).

Tolerance (docs/numerics.md rule 1, as in test_torch_gradients.py): favor computes in
float32; its error against the float64 plain formula (evaluated on the float32-rounded
inputs favor sees) must be at most 2x the error of the same plain formula evaluated by
autograd in float32, plus 1e-6 relative (a few float32 ulps, for when the naive float32
run happens to be almost exact). Errors are max |a - b| / max |b|.
"""
import numpy as np
import torch

import favor
from favor.torch import plain

SLACK = 1e-6
LEARNED_KERNELS = ("positive", "trig", "hyperbolic", "hedgehog")


def learned_map(kernel, m, d, sets, seed, weights=True, bias=True, lambda_=True, spread=0.2):
    """A map with `sets` parameter sets moved away from their starting values (so that every
    parameter matters): W = drawn projection + noise, b, lambda = 1 + noise."""
    fm = favor.FeatureMap.learnable(kernel, m, d, heads=sets, seed=seed, weights=weights,
                                    bias=bias, lambda_=lambda_)
    rng = np.random.default_rng(seed + 100)
    for name in ("weights", "bias", "lambda_"):
        a = getattr(fm, name)
        if a is not None:
            a += (spread * rng.standard_normal(a.shape)).astype(np.float32)
    return fm


def qkv(b=2, h=3, n=11, d=6, dv=5, seed=0, scale=0.7):
    """float32-representable float64 inputs (favor sees exactly these values)."""
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(b, h, n, d, generator=g, dtype=torch.float64) * scale for _ in range(2))
    v = torch.randn(b, h, n, dv, generator=g, dtype=torch.float64)
    return tuple(t.float().double() for t in (q, k, v))


def tensors(fm, dtype=torch.float64):
    """(w, bias, lam) of a FeatureMap as tensors (w: its weights, else the projection)."""
    t = lambda a: None if a is None else torch.from_numpy(np.asarray(a)).to(dtype)
    w = fm.weights if fm.weights is not None else fm.projection
    return t(w), t(fm.bias), t(fm.lambda_)


def plain_attention(q, k, v, fm, causal=False, decay=None, keep=None, dtype=torch.float64):
    """The plain materialised formula of favor.attention(..., feature_map=fm) in `dtype`."""
    w, b, lam = tensors(fm, dtype)
    g = None if decay is None else torch.as_tensor(decay, dtype=dtype).reshape(-1)
    return plain.attention_materialised(q.to(dtype), k.to(dtype), v.to(dtype), w,
                                        kernel=fm.kernel, causal=causal, scale=fm.scale,
                                        keep=keep, bias=b, lam=lam, decay=g)


def rel(a, b):
    """max |a - b| / max |b|, in double."""
    a, b = (np.asarray(x.detach().double().numpy() if isinstance(x, torch.Tensor) else x,
                       dtype=np.float64) for x in (a, b))
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


def assert_twice_naive(got, ref, naive, what=""):
    err, naive_err = rel(got, ref), rel(naive, ref)
    assert err <= 2 * naive_err + SLACK, (
        f"{what}: error {err:.3g} against float64 exceeds 2 x the naive float32 error "
        f"{naive_err:.3g} + {SLACK}")
    return err
