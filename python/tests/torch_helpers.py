"""Shared pieces of the favor.torch tests."""
import numpy as np
import torch

import favor

KERNELS = ["positive", "trig", "hyperbolic", "favorpp", "favorsharp"]


def qkv(b=2, h=2, n=12, d=6, dv=5, nk=None, scale=0.6, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    nk = n if nk is None else nk
    q = torch.randn(b, h, n, d, generator=g, dtype=dtype) * scale
    k = torch.randn(b, h, nk, d, generator=g, dtype=dtype) * scale
    v = torch.randn(b, h, nk, dv, generator=g, dtype=dtype)
    return q, k, v


def fit_for(kernel, q, k):
    """A fit for the data-adapted kernels, from calibration data that is not q, k."""
    if kernel not in ("favorpp", "favorsharp"):
        return None
    cq = (q * 1.1 + 0.05).float().numpy()
    ck = (k * 0.9 - 0.05).float().numpy()
    return favor.fit_kernel(kernel, cq, ck)


def rel(a, b):
    """max |a - b| / max |b|, in double."""
    a, b = (x.detach().double().numpy() if hasattr(x, "detach") else np.asarray(x, dtype=np.float64)
            for x in (a, b))
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


def frob(a, b):
    """Relative Frobenius error |a - b| / |b| in double, on the host (any devices)."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).norm() / max(float(b.norm()), 1e-300))


def seeded_qkv(b, h, n, d, dv, seed, scale=0.7):
    """[q, k, v] float32 [B, H, N, D or Dv] from a seeded generator; q and k times scale."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, x, generator=g) * s for x, s in ((d, scale), (d, scale), (dv, 1))]
