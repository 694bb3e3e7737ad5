"""Hybrid attention (exact softmax on a window and sink tokens, the estimator elsewhere, one
normaliser) materialised as attention/naive.py's attention_materialised is, in any dtype:
the float64 oracle of chunk.py, recurrent.py, the C++ kernels and the Triton ones."""
import math

import torch

from ..attention.naive import feature_map


def hybrid_attention(q, k, v, w, kernel="positive", causal=False, scale=None, keep=None,
                     fit=None, bias=None, lam=None, decay=None, window=0, sinks=0):
    """Hybrid attention materialised (arguments as attention_materialised; Nq = Nk = N):
    exact terms exp(scale q_i.k_j) on E(i) = the window (causal i - window < j <= i, else
    |i - j| < window) and the first `sinks` visible keys of the batch row, estimated terms
    phi(q_i).phi(k_j) on every other visible key (causal: j <= i) times gamma^(i - j -
    window) with a decay; y = A V / A 1, rows whose denominator is not > 0 or whose quotient
    is not finite are zeros. No stabiliser."""
    b, h, n, d = q.shape
    s = 1.0 / math.sqrt(d) if scale is None else scale
    est = (feature_map(q, w, kernel, scale, fit, bias, lam)
           @ feature_map(k, w, kernel, scale, fit, bias, lam).transpose(-1, -2))
    pos = torch.arange(n, device=q.device)
    gap = pos[:, None] - pos[None, :]                                      # i - j
    vis = (torch.ones(b, n, dtype=torch.bool, device=q.device) if keep is None
           else torch.as_tensor(keep, device=q.device).bool())
    sink = vis & (vis.long().cumsum(-1) <= sinks)                          # [B, N]
    seen = vis[:, None, None, :] & ((gap >= 0) if causal else torch.ones_like(gap, dtype=bool))
    near = (gap >= 0) & (gap < window) if causal else gap.abs() < window
    exact = seen & (near | sink[:, None, None, :])
    if decay is not None:
        if not causal:
            raise ValueError("decay: causal attention only")
        g = torch.as_tensor(decay, dtype=est.dtype).reshape(1, -1, 1, 1)
        est = est * torch.exp(torch.log(g) * (gap - window).clamp(min=0).to(est.dtype))
    a = torch.where(exact, torch.exp((q @ k.transpose(-1, -2)) * s),
                    torch.where(seen, est, torch.zeros_like(est)))
    num = a @ v
    den = a.sum(-1, keepdim=True)
    ok = den > 0
    y = num / torch.where(ok, den, torch.ones_like(den))
    ok = ok & torch.isfinite(y).all(-1, keepdim=True)
    return torch.where(ok, y, torch.zeros_like(y))
