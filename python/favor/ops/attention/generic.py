"""favor's attention in plain torch operations on any device (the torch path): bidirectional
and chunked causal FAVOR with the C++ kernels' stabiliser (docs/numerics.md), every kernel and
learned map through the canonical map (canonical.py), key masks, decay; gradients by autograd.

Stabiliser, as in C++: key j is taken at M_j, the running max of its log-features over the
kept keys <= j (bidirectional: one max per head), its per-key offset g_j - M_j formed in
float64 and rounded once; query row i reads every key at its own scale M_i (factors
exp(M_j - M_i) <= 1) and is shifted by c_i = max over live f of (a_if + log P_if), P_i the
row's normaliser: the denominator is >= 1, dead features (P_if < FLT_MIN) read 0, no epsilon.
Rows whose denominator is not > 0 or whose quotient is not finite are zeros. The shifts are
constants for autograd (the output does not depend on them).

linear_core is the part shared with Transformer-VQ's torch path (ops/vq/generic.py): given key
features at their scales and query log-features it returns phi(q_i) [S_i | s_i] for augmented
values, chunk by chunk.
"""
import torch

from .canonical import EXP_PM, TRIG, per_head

TINY = torch.finfo(torch.float32).tiny
_FAR = -1e30  # stands for a scale of -inf (no key yet): exp(_FAR - _FAR) = 1 on zero sums


def projections(x, cm):
    """a = x W^T + bias for x [BH, N, D]: [BH, N, m] float32."""
    bh = x.shape[0]
    a = x @ per_head(cm.W, bh).transpose(-1, -2)
    if cm.bias is not None:
        a = a + per_head(cm.bias, bh).unsqueeze(1)
    return a


def _signed(a, kind):
    """The log-features +-a (EXP_PM) or a (EXP) of a projection a [.., m]."""
    return torch.cat([a, -a], -1) if kind == EXP_PM else a


def key_features(k, cm, keep, causal, positions=None):
    """(phi [BH, N, F] float32, M [BH, N] float64): the key features of canonical.md at their
    scales M_j (causal: running max over kept keys <= j; else one max per head, repeated),
    masked keys zero. M is -inf before the first kept key. positions [BH, N] float64: the
    keys' decay clocks (default 0..N-1)."""
    bh, n, _ = k.shape
    a = projections(k, cm)
    g = cm.norm_coef * (k.double() * k.double()).sum(-1)             # [BH, N] float64
    if cm.rate is not None:
        if positions is None:
            positions = torch.arange(n, device=k.device, dtype=torch.float64)
        g = g + per_head(cm.rate.to(k.device), bh)[:, None] * positions
    logw = None if cm.key_logw is None else per_head(cm.key_logw, bh).unsqueeze(1)
    if cm.kind == TRIG:
        rel = torch.zeros_like(a) if logw is None else logw.expand_as(a)
        amp = torch.cat([torch.sin(a), torch.cos(a)], -1)
        rel = torch.cat([rel, rel], -1)
    else:
        rel = _signed(a, cm.kind)
        if logw is not None:
            rel = rel + torch.cat([logw, logw], -1) if cm.kind == EXP_PM else rel + logw
    with torch.no_grad():
        top = rel.amax(-1).double() + g                               # row max of l_jf
        if keep is not None:
            top = top.masked_fill(~keep, float("-inf"))
        scale = torch.cummax(top, -1).values if causal else top.amax(-1, keepdim=True).expand(bh, n)
    offset = (g - scale.masked_fill(torch.isinf(scale), 0.0)).float()  # g_j - M_j, rounded once
    # Masked keys (and keys before the first kept one) are -inf in the exponent, not zeroed
    # after it: their offset is against the kept keys' max and could overflow, and inf * 0
    # is NaN in the forward and in exp's backward.
    valid = ~torch.isinf(scale) if keep is None else keep & ~torch.isinf(scale)
    arg = (rel + offset.unsqueeze(-1)).masked_fill(~valid.unsqueeze(-1), float("-inf"))
    phi = torch.exp(arg)
    if cm.kind == TRIG:
        phi = phi * amp
    return phi, scale


def query_logits(q, cm):
    """What the query side reads: +-a (EXP kinds: log-features before the shift) or the
    amplitude [sin a, cos a] (TRIG), [BH, N, F]."""
    a = projections(q, cm)
    if cm.kind == TRIG:
        return torch.cat([torch.sin(a), torch.cos(a)], -1)
    return _signed(a, cm.kind)


def shifted(lq, norm, with_shift=False):
    """psi = exp(lq - c) with c = max over live f of (lq + log norm), dead features 0
    (norm [.., F] the row's normaliser; lq [.., F]); with_shift: (psi, c [.., 1])."""
    live = norm >= TINY
    logs = torch.log(torch.where(live, norm, torch.ones_like(norm)))
    with torch.no_grad():
        c = torch.where(live, lq + logs, torch.full_like(lq, float("-inf"))).amax(-1, keepdim=True)
        c = torch.where(torch.isinf(c), torch.zeros_like(c), c)
    # dead features are -inf in the exponent (an exp that overflows there would give
    # inf * 0 = NaN in the backward)
    psi = torch.exp((lq - c).masked_fill(~live, float("-inf")))
    return (psi, c) if with_shift else psi


def linear_core(lq, shift, phi, scale, vx, causal, norm_col, chunk=64, with_scale=False):
    """out_i = sum_j psi_i.phi_j exp(M_j - M_i) vx_j over the keys row i sees, [BH, Nq, W].

    lq [BH, Nq, F] query log-features (shift True: psi = exp(lq - c_i), see shifted) or the
    query features themselves (shift False); phi [BH, Nk, F] key features at scales
    scale [BH, Nk] (float64, -inf before any key); vx [BH, Nk, W] with column norm_col the
    ones (the normaliser). Causal: Nq = Nk, in chunks of `chunk` rows: the state of earlier
    chunks (at the scale of the chunk before) plus the masked intra-chunk product.
    with_scale: (out, L) with L [BH, Nq] float64 (no grad) each row's log scale c_i + M_i:
    sum_j exp(lq_i).phi_j e^(M_j) vx_j = e^(L_i) out_i; -inf where the row sees no key."""
    if not causal:
        sx = phi.transpose(-1, -2) @ vx                                   # [BH, F, W]
        psi, c = shifted(lq, sx[..., norm_col].unsqueeze(1), True) if shift else (lq, None)
        out = psi @ sx
        if not with_scale:
            return out
        rows = scale[:, :1].expand(*out.shape[:2])                        # one M per head
        return out, rows if c is None else rows + c.squeeze(-1).double()
    bh, n, f = phi.shape
    w = vx.shape[-1]
    safe = scale.masked_fill(torch.isinf(scale), _FAR)
    state = phi.new_zeros(bh, f, w)
    state_scale = torch.full((bh, 1), _FAR, dtype=torch.float64, device=phi.device)
    parts, shifts = [], []
    # split, not slicing in a loop: a slice's backward writes a full-size gradient
    for lc, pc, mc, vc in zip(lq.split(chunk, 1), phi.split(chunk, 1), safe.split(chunk, 1),
                              vx.split(chunk, 1)):
        c = pc.shape[1]
        inter = torch.exp(state_scale - mc).float().unsqueeze(-1)                  # [BH, c, 1]
        tril = torch.ones(c, c, dtype=torch.bool, device=phi.device).tril()
        decay = torch.exp((mc.unsqueeze(1) - mc.unsqueeze(2)).masked_fill(~tril, -torch.inf))
        decay = decay.float()                                                    # [BH, c, c]
        if shift:
            norm = inter * state[..., norm_col].unsqueeze(1) + decay @ pc          # P_i [BH, c, F]
            psi, c = shifted(lc, norm, True)
            shifts.append(c.squeeze(-1))
        else:
            psi = lc
        local = (psi @ pc.transpose(-1, -2)) * decay
        parts.append(inter * (psi @ state) + local @ vc)
        last = mc[:, -1:]
        carry = torch.exp(mc - last).float().unsqueeze(-1)                         # [BH, c, 1]
        state = torch.exp(state_scale - last).float().unsqueeze(-1) * state \
            + (pc * carry).transpose(-1, -2) @ vc
        state_scale = last
    out = torch.cat(parts, 1)
    if not with_scale:
        return out
    return out, scale + (torch.cat(shifts, 1).double() if shift else 0.0)


def ratio(out, dv):
    """y = num / den of [num | den] rows [.., dv + 1]; rows whose denominator is not > 0 or
    whose quotient is not finite are zeros (docs/numerics.md)."""
    num, den = out[..., :dv], out[..., dv:]
    ok = den > 0
    y = num / torch.where(ok, den, torch.ones_like(den))
    ok = ok & torch.isfinite(y).all(-1, keepdim=True)
    return torch.where(ok, y, torch.zeros_like(y))


def attention(q, k, v, cm, keep, causal, chunk=64):
    """FAVOR attention y [BH, Nq, Dv] float32 of q [BH, Nq, D], k [BH, Nk, D], v [BH, Nk,
    Dv] (float32) under the CanonicalMap cm; keep [BH, Nk] bool (True = the key takes part)
    or None."""
    phi, scale = key_features(k, cm, keep, causal)
    vx = torch.cat([v, torch.ones_like(v[..., :1])], -1)
    out = linear_core(query_logits(q, cm), cm.kind != TRIG, phi, scale, vx, causal,
                      v.shape[-1], chunk)
    return ratio(out, v.shape[-1])
