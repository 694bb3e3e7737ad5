"""favor's estimators written in plain torch operations, differentiable by autograd.

- feature_map / attention_materialised: the formulas of docs/math.md exactly as written,
  materialising the N x N matrix, without stabilisation, in any dtype: the float64 oracle
  of the Python tests (small inputs only). With learned maps too (favor.FeatureMap): per-head
  projections, biases, feature weights lambda, the hedgehog kernel, and causal decay.
- favor_plus: FAVOR+ (positive kernel) in linear time, stabilised, bidirectional or
  chunked causal: the plain-PyTorch baseline of favor.bench.
The oracles of the other ops: favor/ops/exact/naive.py (softmax attention),
favor/ops/hybrid/naive.py (hybrid attention) and favor/ops/vq/naive.py (Transformer-VQ);
favor.torch.plain gathers them.
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


def per_head(t, b, h):
    """A parameter with `sets` entries along axis 0 (1, H or B*H: head (b, h) uses set
    (b H + h) % sets) viewed as [B or 1, H or 1, ...] to broadcast against [B, H, ...]."""
    sets = t.shape[0]
    if sets == 1:
        return t.reshape(1, 1, *t.shape[1:])
    if sets == h:
        return t.reshape(1, h, *t.shape[1:])
    if sets == b * h:
        return t.reshape(b, h, *t.shape[1:])
    raise ValueError(f"sets: {sets} parameter sets; must be 1, H ({h}) or B*H ({b * h})")


def feature_map(x, w, kernel="positive", scale=None, fit=None, bias=None, lam=None):
    """phi(x) for x [B, H, N, D] and W [m, D], every constant kept (docs/math.md s.2):
    positive m^-1/2 exp(Wx - |x|^2/2); trig m^-1/2 exp(|x|^2/2) [sin Wx, cos Wx];
    hyperbolic (2m)^-1/2 exp(-|x|^2/2) [exp Wx, exp -Wx]; hedgehog [exp Wx, exp -Wx] (no
    norm factor, no constant); favorpp / favorsharp with the fit's per-head directions Q and
    A_l: m^-1/2 prod_l (1-4A_l)^(1/4) exp(sum_l A_l w_l^2 + w.(Bx) - |x|^2/2),
    B = diag(sqrt(1-4A)) Q^T. (x is scaled by sqrt(scale) first.)
    Learned maps (favor.FeatureMap): w may be per-head [sets, m, D], bias [sets, m] is added
    to Wx, lam [sets, m] multiplies every feature of its row (sets 1, H or B*H: per_head)."""
    b, h, n, d = x.shape
    m = w.shape[-2]
    if w.dim() == 3 or bias is not None or lam is not None or kernel == "hedgehog":
        return _learned_map(x, w, kernel, scale, bias, lam)
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


def _learned_map(x, w, kernel, scale, bias, lam):
    """feature_map with per-head W, bias and lambda (see feature_map)."""
    b, h, n, d = x.shape
    m = w.shape[-2]
    s = 1.0 / math.sqrt(d) if scale is None else scale
    x = x * math.sqrt(s)
    w4 = per_head(w, b, h) if w.dim() == 3 else w
    a = x @ w4.transpose(-1, -2)                                  # [B, H, N, m]
    if bias is not None:
        a = a + per_head(bias, b, h).unsqueeze(-2)
    sq = (x * x).sum(-1, keepdim=True) / 2
    if kernel == "positive":
        phi = torch.exp(a - sq) / math.sqrt(m)
    elif kernel == "trig":
        phi = torch.exp(sq) * torch.cat([torch.sin(a), torch.cos(a)], -1) / math.sqrt(m)
    elif kernel == "hyperbolic":
        phi = torch.exp(-sq) * torch.cat([torch.exp(a), torch.exp(-a)], -1) / math.sqrt(2 * m)
    elif kernel == "hedgehog":
        phi = torch.cat([torch.exp(a), torch.exp(-a)], -1)
    else:
        raise ValueError(f"kernel: '{kernel}' takes no learned parameters")
    if lam is not None:
        l4 = per_head(lam, b, h).unsqueeze(-2)                    # [., ., 1, m]
        phi = phi * (l4 if phi.shape[-1] == m else torch.cat([l4, l4], -1))
    return phi


def decay_matrix(gamma, n, dtype=torch.float64):
    """gamma^(i - j) for j <= i, else 0: [1, H or 1, N, N] from gamma [1] or [H]."""
    i = torch.arange(n, dtype=dtype)
    steps = (i[:, None] - i[None, :]).clamp(min=0)
    g = torch.as_tensor(gamma, dtype=dtype).reshape(1, -1, 1, 1)
    return torch.exp(torch.log(g) * steps) * torch.ones(n, n, dtype=dtype).tril()


def attention_materialised(q, k, v, w, kernel="positive", causal=False, scale=None,
                           keep=None, fit=None, bias=None, lam=None, decay=None):
    """y = A V / A 1 with A = phi(Q) phi(K)^T, masked keys (keep [B, Nk] False) and, when
    causal, keys after the query removed; rows whose denominator is <= 0 (no visible key,
    or trig) are zeros, as favor defines them. bias, lam: the learned map's (feature_map;
    lambda on both sides, so lambda^2 enters). decay (causal): gamma [1] or [H], A_ij times
    gamma^(i - j)."""
    a = (feature_map(q, w, kernel, scale, fit, bias, lam)
         @ feature_map(k, w, kernel, scale, fit, bias, lam).transpose(-1, -2))
    if keep is not None:
        a = a * torch.as_tensor(keep, dtype=torch.bool)[:, None, None, :].to(a.dtype)
    if causal:
        a = torch.tril(a)
    if decay is not None:
        if not causal:
            raise ValueError("decay: causal attention only")
        a = a * decay_matrix(decay, a.shape[-1], a.dtype)
    num = a @ v
    den = a.sum(-1, keepdim=True)
    ok = den > 0
    return torch.where(ok, num / torch.where(ok, den, torch.ones_like(den)), torch.zeros_like(num))


def favor_plus_features(q, k, w, scale=None):
    """FAVOR+ features of q and k materialised, with the usual stabilisation (a per-row max
    for queries, one max per head for keys; both cancel in the ratio): (phi(Q), phi(K))."""
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    r = math.sqrt(s)
    lq = (q * r) @ w.t() - (q * q).sum(-1, keepdim=True) * (s / 2)
    lk = (k * r) @ w.t() - (k * k).sum(-1, keepdim=True) * (s / 2)
    pq = torch.exp(lq - lq.amax(-1, keepdim=True).detach())
    pk = torch.exp(lk - lk.amax(dim=(-1, -2), keepdim=True).detach())
    return pq, pk


def favor_plus(q, k, v, w, causal=False, scale=None, chunk=64):
    """FAVOR+ in linear time with the usual stabilisation (a per-row max for queries, one
    max per head for keys), in plain torch ops: bidirectional phi(Q) (phi(K)^T [V | 1]);
    causal in chunks of `chunk` tokens: the state of earlier chunks plus the masked
    intra-chunk product. q, k [B, H, N, D], v [B, H, N, Dv], w [m, D]."""
    pq, pk = favor_plus_features(q, k, w, scale)
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
