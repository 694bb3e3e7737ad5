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


def trig_bound(q, k, v, w, causal, mask=None, decay=None):
    """Elementwise bound on |y_f32 - y| for trig FAVOR in float32: property_helpers.favor_bound's
    rule (docs/numerics.md), with an optional decay. Trig features change sign, so a row whose
    denominator cancels amplifies every rounding by sum_j |A_ij| / |sum_j A_ij| (up to ~1e3 in
    test_torch_path's cases): rule 1's yardstick, one naive float32 evaluation, then varies with
    the BLAS's kernel (MKL's SSE4.2 sgemm gave 30x less error than its AVX-512 one), so trig rows
    are held to this bound instead. A pair term A_ij = phi(q_i).phi(k_j) is off by at most
    delta_i sum_f |phi_f(q_i) phi_f(k_j)| with delta = u (2 (D + 4) size + 2 (F + Nk) + 8), size
    = |w_f||x| + |x|^2 of the row and the largest key; |dy_ic| <= 1.5 delta_i sum_j |A|_ij
    (|v_jc| + |y_ic|) / |den_i|. q, k, v: [B, H, N, X]; w [m, D]; mask [B, Nk], True = kept."""
    qd, kd, vd, wd = (t.detach().double() for t in (q, k, v, w))
    d, nq, nk, m = qd.shape[-1], qd.shape[-2], kd.shape[-2], wd.shape[0]
    s = d ** -0.25
    xq, xk = qd * s, kd * s
    aq, ak = xq @ wd.T, xk @ wd.T                                    # [B, H, N, m]
    # |phi_f(q) phi_f(k)| summed over the sin and cos features: the constants exp(|x|^2/2) /
    # m cancel in the ratio and are left out of both the terms and their magnitudes.
    signed = torch.sin(aq) @ torch.sin(ak).transpose(-1, -2) + torch.cos(aq) @ torch.cos(ak).transpose(-1, -2)
    mag = torch.sin(aq).abs() @ torch.sin(ak).abs().transpose(-1, -2) + \
        torch.cos(aq).abs() @ torch.cos(ak).abs().transpose(-1, -2)
    scale_q = torch.exp(xq.pow(2).sum(-1) / 2)[..., :, None]
    scale_k = torch.exp(xk.pow(2).sum(-1) / 2)[..., None, :]
    signed, mag = signed * scale_q * scale_k, mag * scale_q * scale_k
    keep = torch.ones(qd.shape[0], 1, nq, nk, dtype=torch.bool)
    if mask is not None:
        keep = keep & mask[:, None, None, :].bool()
    if causal:
        keep = keep & torch.ones(nq, nk, dtype=torch.bool).tril()
    weight = torch.ones(qd.shape[0], qd.shape[1], nq, nk, dtype=torch.float64)
    if decay is not None:
        i = torch.arange(nq, dtype=torch.float64)[:, None]
        j = torch.arange(nk, dtype=torch.float64)[None, :]
        gamma = decay.double().reshape(1, -1, 1, 1).expand(1, qd.shape[1], 1, 1)
        weight = gamma ** (i - j).clamp_min(0)
    signed = torch.where(keep, signed * weight, 0.0)
    mag = torch.where(keep, mag * weight, 0.0)
    # Rows whose denominator is <= 0 (no visible key, or trig's cancellation) are zeros, as
    # favor defines them; their bound still scales with 1 / |den| (float32 may land either side).
    den = signed.sum(-1, keepdim=True)
    den = torch.where(keep.any(-1, keepdim=True), den, 1.0)
    y = torch.where(den > 0, (signed @ vd) / den, 0.0)
    wn = wd.norm(dim=1).max()
    size = (wn * xq.norm(dim=-1) + xq.pow(2).sum(-1) + wn * xk.norm(dim=-1).amax(-1, keepdim=True)
            + xk.pow(2).sum(-1).amax(-1, keepdim=True))
    delta = 2.0 ** -24 * (2 * (d + 4) * size + 2 * (2 * m + nk) + 8)
    magw = mag / den.abs()
    spread = magw @ vd.abs() + y.abs() * magw.sum(-1, keepdim=True)
    return y, 1.5 * delta[..., None] * spread + 1e-30
