"""favor's estimators written in plain torch operations, differentiable by autograd.

- feature_map / attention_materialised: the formulas of docs/math.md exactly as written,
  materialising the N x N matrix, without stabilisation, in any dtype: the float64 oracle
  of the Python tests (small inputs only).
- favor_plus: FAVOR+ (positive kernel) in linear time, stabilised, bidirectional or
  chunked causal: the plain-PyTorch baseline of favor.bench.
- softmax_attention: softmax(scale q k^T) v, the textbook formula.
"""
import math

import torch


def _fit_tensors(fit, bh, d, dtype):
    """(A [bh, d], Q [bh, d, d]) per (batch, head) from a favor.KernelFit."""
    a = torch.as_tensor(fit.a, dtype=dtype)
    basis = torch.as_tensor(fit.basis, dtype=dtype)
    if fit.heads == 1:
        a, basis = a.expand(bh, d), basis.expand(bh, d, d)
    return a, basis


def feature_map(x, w, kernel="positive", scale=None, fit=None):
    """phi(x) for x [B, H, N, D] and W [m, D], every constant kept (docs/math.md s.2):
    positive m^-1/2 exp(Wx - |x|^2/2); trig m^-1/2 exp(|x|^2/2) [sin Wx, cos Wx];
    hyperbolic (2m)^-1/2 exp(-|x|^2/2) [exp Wx, exp -Wx]; favorpp / favorsharp with the
    fit's per-head directions Q and A_l: m^-1/2 prod_l (1-4A_l)^(1/4)
    exp(sum_l A_l w_l^2 + w.(Bx) - |x|^2/2), B = diag(sqrt(1-4A)) Q^T."""
    b, h, n, d = x.shape
    m = w.shape[0]
    s = 1.0 / math.sqrt(d) if scale is None else scale
    x = x * math.sqrt(s)
    sq = (x * x).sum(-1, keepdim=True) / 2
    if kernel in ("favorpp", "favorsharp", "favor++", "favor#"):
        a, basis = _fit_tensors(fit, b * h, d, x.dtype)
        a = a.reshape(b, h, 1, d)
        basis = basis.reshape(b, h, d, d)
        # W_h row f = Q diag(sqrt(1-4A)) w_f; bias_f = sum_l A_l w_fl^2
        w_eff = torch.einsum("bhdl,bhl,fl->bhfd", basis, torch.sqrt(1 - 4 * a[:, :, 0]), w)
        bias = torch.einsum("bhl,fl->bhf", a[:, :, 0], w * w).unsqueeze(2)
        const = torch.log(1 - 4 * a).sum(-1, keepdim=True) / 4 - math.log(m) / 2
        return torch.exp(torch.einsum("bhnd,bhfd->bhnf", x, w_eff) + bias - sq + const)
    proj = x @ w.transpose(0, 1)
    if kernel == "positive":
        return torch.exp(proj - sq) / math.sqrt(m)
    if kernel == "trig":
        return torch.exp(sq) * torch.cat([torch.sin(proj), torch.cos(proj)], -1) / math.sqrt(m)
    if kernel == "hyperbolic":
        return torch.exp(-sq) * torch.cat([torch.exp(proj), torch.exp(-proj)], -1) / math.sqrt(2 * m)
    raise ValueError(f"kernel: '{kernel}' is not a kernel")


def attention_materialised(q, k, v, w, kernel="positive", causal=False, scale=None,
                           keep=None, fit=None):
    """y = A V / A 1 with A = phi(Q) phi(K)^T, masked keys (keep [B, Nk] False) and, when
    causal, keys after the query removed; rows whose denominator is <= 0 (no visible key,
    or trig) are zeros, as favor defines them."""
    a = feature_map(q, w, kernel, scale, fit) @ feature_map(k, w, kernel, scale, fit).transpose(-1, -2)
    if keep is not None:
        a = a * torch.as_tensor(keep, dtype=torch.bool)[:, None, None, :].to(a.dtype)
    if causal:
        a = torch.tril(a)
    num = a @ v
    den = a.sum(-1, keepdim=True)
    ok = den > 0
    return torch.where(ok, num / torch.where(ok, den, torch.ones_like(den)), torch.zeros_like(num))


def favor_plus(q, k, v, w, causal=False, scale=None, chunk=64):
    """FAVOR+ in linear time with the usual stabilisation (a per-row max for queries, one
    max per head for keys), in plain torch ops: bidirectional phi(Q) (phi(K)^T [V | 1]);
    causal in chunks of `chunk` tokens: the state of earlier chunks plus the masked
    intra-chunk product. q, k [B, H, N, D], v [B, H, N, Dv], w [m, D]."""
    d = q.shape[-1]
    s = 1.0 / math.sqrt(d) if scale is None else scale
    r = math.sqrt(s)
    lq = (q * r) @ w.t() - (q * q).sum(-1, keepdim=True) * (s / 2)
    lk = (k * r) @ w.t() - (k * k).sum(-1, keepdim=True) * (s / 2)
    pq = torch.exp(lq - lq.amax(-1, keepdim=True).detach())
    pk = torch.exp(lk - lk.amax(dim=(-1, -2), keepdim=True).detach())
    v1 = torch.cat([v, torch.ones_like(v[..., :1])], -1)
    if not causal:
        out = pq @ (pk.transpose(-1, -2) @ v1)
    else:
        state = torch.zeros(*q.shape[:-2], w.shape[0], v1.shape[-1], dtype=q.dtype)
        parts = []
        # split, not slicing in a loop: a slice's backward writes a full-size gradient
        # (quadratic in N over the chunks); split's backward is one concatenation
        for qc, kc, vc in zip(pq.split(chunk, -2), pk.split(chunk, -2), v1.split(chunk, -2)):
            local = torch.tril(qc @ kc.transpose(-1, -2)) @ vc
            parts.append(qc @ state + local)
            state = state + kc.transpose(-1, -2) @ vc
        out = torch.cat(parts, -2)
    return out[..., :-1] / out[..., -1:]


def softmax_attention(q, k, v, causal=False, scale=None):
    """softmax(scale q k^T) v, materialising the N x N scores."""
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * s
    if causal:
        n = q.shape[-2]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, -1) @ v
