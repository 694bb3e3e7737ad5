"""Hybrid attention in plain torch operations (the torch path; the C++ kernels split it the
same way): exact softmax on a window and on sink tokens, FAVOR's estimator on every other
key, one normaliser. For query i (Nq = Nk = N):

    E(i) = window {i - w < j <= i} (causal) or {|i - j| < w}, plus the first s visible keys
    R(i) = every other visible key (causal: j <= i - w; else j <= i - w or j >= i + w)
    y_i  = [sum_E exp(s_ij) v_j + sum_R g_ij phi(q_i).phi(k_j) v_j] / [the same with v_j = 1]

with s_ij = scale q_i.k_j and g_ij = gamma^(i - j - w) (causal decay from the window's edge).
Each part gives unnormalised rows [num | den] at a per-row log scale L_p,i (a no-grad float64
constant: the part's stabiliser); the parts merge at S_i = max_p L_p,i. The band (E) is
in blocks, O(N (w + s) D); the keys before the window are causal FAVOR of q[w:] against
k[:N-w] (a plain causal call in the window-shifted frame, sinks removed from the mask); the
keys after it (bidirectional) the same on the reversed sequence.
"""
import math

import torch

from ... import _core
from ..attention.canonical import TRIG, kind_of, per_head
from ..attention.generic import key_features, linear_core, query_logits, ratio


def pair_log_const(kernel, m, fit_a=None):
    """log of the constant factor of phi(q).phi(k) that the canonical map leaves out (it
    cancels in the plain ratio, not against exact terms): m^-1 (positive, trig), (2m)^-1
    (hyperbolic), 1 (hedgehog), FAVOR++ / FAVOR# m^-1 prod_l (1-4A_l)^(1/2) per fit set
    (fit_a [sets, D]: a float64 tensor [sets])."""
    c = 2.0 * _core.feature_log_constant(kind_of(kernel)[0], m)  # C++'s constant, bound
    if fit_a is None:
        return c
    return c + 0.5 * torch.log1p(-4 * fit_a.detach().double()).sum(-1)


def _band(q, k, v, keep, sink, sinks, causal, w, scale):
    """The exact part over E(i): (out [BH, N, Dv + 1] at log scale L [BH, N] float64, the
    row's max score). sink [BH, N] bool marks the (at most `sinks`) sink keys; a sink inside
    the window counts once (as a window key). The window in blocks of b >= w queries, each
    against its own span of keys (b + w - 1 causal, b + 2w - 2 bidirectional): strided views
    of the padded keys and values, one batched matmul for the scores and one for P V."""
    bh, n, _ = q.shape
    w = min(w, n)
    scores, values, live = [], [], []
    if w > 0:
        s_w, v_w, l_w = _window_blocks(q, k, v, keep, causal, w, scale)
        scores.append(s_w)
        values.append(v_w)
        live.append(l_w)
    if sinks > 0:
        i = torch.arange(n, device=q.device)
        # the sinks: positions [BH, s] (ascending; rows with fewer point past the end)
        sidx = torch.where(sink, i, i + n).topk(min(sinks, n), -1, largest=False).values
        gap = i[:, None] - sidx.unsqueeze(1)                              # i - j [BH, N, s]
        ok = (sidx < n).unsqueeze(1)
        ok = ok & (gap >= w) if causal else ok & (gap.abs() >= w)       # outside the window
        take = sidx.clamp(max=n - 1).unsqueeze(-1)
        ks = torch.gather(k, 1, take.expand(-1, -1, k.shape[-1]))        # [BH, s, D]
        scores.append((q @ ks.transpose(1, 2)) * scale)                  # [BH, N, s]
        values.append(torch.gather(v, 1, take.expand(-1, -1, v.shape[-1])))
        live.append(ok)
    if not scores:
        return q.new_zeros(bh, n, v.shape[-1] + 1), q.new_full((bh, n), -math.inf).double()
    scores = [sc.masked_fill(~ok, -math.inf) for sc, ok in zip(scores, live)]
    with torch.no_grad():
        top = torch.stack([sc.amax(-1) for sc in scores]).amax(0).unsqueeze(-1)  # [BH, N, 1]
        safe = top.masked_fill(torch.isinf(top), 0.0)
    num, den = 0, 0
    for sc, val in zip(scores, values):
        p = torch.exp(sc - safe)
        num = num + (p @ val if isinstance(val, torch.Tensor) else _unblock(p, *val, n))
        den = den + p.sum(-1, keepdim=True)
    return torch.cat([num, den], -1), top.squeeze(-1).double()


def _window_blocks(q, k, v, keep, causal, w, scale):
    """The window's scores [BH, N, span] (row i, column c: key (i - i mod b) - (w - 1) + c),
    (the blocked values [BH, nb, span, Dv], b) and the live mask [BH, N, span]."""
    bh, n, d = q.shape
    b = max(w, 32)
    nb = -(-n // b)
    span = b + (w - 1 if causal else 2 * (w - 1))
    right = nb * b - n + (0 if causal else w - 1)
    kp = torch.nn.functional.pad(k, (0, 0, w - 1, right))               # key j at j + w - 1
    vp = torch.nn.functional.pad(v, (0, 0, w - 1, right))
    kb = kp.unfold(1, span, b)                                          # [BH, nb, D, span]
    vb = vp.unfold(1, span, b).transpose(-1, -2)                        # [BH, nb, span, Dv]
    qb = torch.nn.functional.pad(q, (0, 0, 0, nb * b - n)).view(bh, nb, b, d)
    scores = (qb @ kb) * scale                                          # [BH, nb, b, span]
    r = torch.arange(b, device=q.device)[:, None]
    c = torch.arange(span, device=q.device)[None, :]
    band = (c >= r) & (c <= r + (w - 1 if causal else 2 * (w - 1)))    # [b, span]
    kept = torch.ones(bh, n, dtype=torch.bool, device=q.device) if keep is None else keep
    valid = torch.nn.functional.pad(kept, (w - 1, right)).unfold(1, span, b)  # [BH, nb, span]
    live = band & valid.unsqueeze(2)                                    # [BH, nb, b, span]
    return (scores.reshape(bh, nb * b, span)[:, :n], (vb, b),
            live.reshape(bh, nb * b, span)[:, :n])


def _unblock(p, vb, b, n):
    """P V of the window: p [BH, N, span] against the blocked values [BH, nb, span, Dv]."""
    bh, nb, span, dv = vb.shape
    pb = torch.nn.functional.pad(p, (0, 0, 0, nb * b - n)).view(bh, nb, b, span)
    return (pb @ vb).reshape(bh, nb * b, dv)[:, :n]


def _before(q, k, vx, cm, keep, w, log_const, chunk):
    """The estimated part over keys j <= i - w (keep: the kept non-sink keys): causal FAVOR
    of q[w:] against k[:N - w], (out [BH, N, Dv + 1] at log scale L [BH, N] float64; rows
    i < w are empty: zeros at -inf). Decay: the shifted frame's plain decay gamma^(r - j),
    r = i - w."""
    bh, n, _ = q.shape
    out = vx.new_zeros(bh, n, vx.shape[-1])
    scale = torch.full((bh, n), -math.inf, dtype=torch.float64, device=q.device)
    r = n - w
    if r <= 0:
        return out, scale
    phi, m = key_features(k[:, :r], cm, None if keep is None else keep[:, :r], True)
    part, lse = linear_core(query_logits(q[:, w:], cm), cm.kind != TRIG, phi, m, vx[:, :r],
                            True, vx.shape[-1] - 1, chunk, with_scale=True)
    t = row_terms(q[:, w:], cm, log_const, True)
    # the row's own factors: exactly 1 in value (they live in L), differentiable
    part = part * torch.exp(t - t.detach()).float().unsqueeze(-1)
    return torch.cat([out[:, :w], part], 1), torch.cat([scale[:, :w], lse + t.detach()], 1)


def row_terms(q, cm, log_const, causal):
    """What the canonical map leaves out of row i's phi(q_i).phi(k_j), as a log [BH, Nq]
    float64: the constant, the query's norm term and (causal) the query's decay clock
    -rate r (r = 0, 1, ..: the row in its frame)."""
    bh, n, _ = q.shape
    t = cm.norm_coef * (q.double() * q.double()).sum(-1)
    if torch.is_tensor(log_const):
        t = t + per_head(log_const.to(q.device), bh)[:, None]
    else:
        t = t + log_const
    if causal and cm.rate is not None:
        clock = torch.arange(n, device=q.device, dtype=torch.float64)
        t = t - per_head(cm.rate.to(q.device), bh)[:, None] * clock
    return t


def _all(q, k, vx, cm, keep, log_const):
    """The estimated part over every kept key (bidirectional, window 0): (out, L)."""
    phi, m = key_features(k, cm, keep, False)
    out, lse = linear_core(query_logits(q, cm), cm.kind != TRIG, phi, m, vx, False,
                           vx.shape[-1] - 1, with_scale=True)
    t = row_terms(q, cm, log_const, False)
    return out * torch.exp(t - t.detach()).float().unsqueeze(-1), lse + t.detach()


def merge(parts, dv):
    """y from parts [(out [BH, N, Dv + 1], L [BH, N])]: the sum at S_i = max_p L_p,i over
    the finite L (factors exp(L_p,i - S_i) <= 1), then ratio's zero-row rule."""
    top = torch.stack([lse for _, lse in parts]).amax(0)
    top = top.masked_fill(torch.isinf(top), 0.0)
    acc = sum(torch.exp(lse - top).float().unsqueeze(-1) * out for out, lse in parts)
    return ratio(acc, dv)


def sink_mask(keep, n, sinks, bh, device):
    """[BH, N] bool: the first `sinks` visible keys of each row."""
    kept = torch.ones(bh, n, dtype=torch.bool, device=device) if keep is None else keep
    return kept & (kept.long().cumsum(-1) <= sinks)


def hybrid_attention(q, k, v, cm, keep, causal, window, sinks, chunk=64, *, scale,
                     log_const, band=None):
    """Hybrid attention y [BH, N, Dv] float32 of q, k [BH, N, D], v [BH, N, Dv] (float32)
    under the CanonicalMap cm; keep [BH, N] bool (True = the key takes part) or None; window
    w >= 0 and sinks s >= 0 (w + s > 0: the caller sends w = s = 0 to generic.attention);
    scale: the softmax temperature of the exact terms; log_const: pair_log_const of the
    map (a float or [sets] tensor). Differentiable by autograd like generic.attention."""
    n, dv = q.shape[1], v.shape[-1]
    sink = sink_mask(keep, n, sinks, q.shape[0], q.device)
    rest = ~sink if keep is None else keep & ~sink                      # the estimated keys
    vx = torch.cat([v, torch.ones_like(v[..., :1])], -1)
    # the exact part: _band, or a device kernel with its contract (triton/band.py)
    parts = [(band or _band)(q, k, v, keep, sink, sinks, causal, window, scale)]
    if not causal:
        cm = cm._replace(rate=None)  # decay is causal only
    if window == 0 and not causal:
        parts.append(_all(q, k, vx, cm, rest, log_const))
    else:
        parts.append(_before(q, k, vx, cm, rest, window, log_const, chunk))
        if not causal:  # keys j >= i + w: the same on the reversed sequence
            out, lse = _before(*(t.flip(1) for t in (q, k, vx)), cm, rest.flip(1), window,
                               log_const, chunk)
            parts.append((out.flip(1), lse.flip(1)))
    return merge(parts, dv)


def window_attention(q, k, v, keep, causal, window, sinks, scale):
    """Exact softmax on the window and the sinks alone, the estimator removed: y [BH, N, Dv]
    (q, k, v [BH, N, D or Dv] float32, keep [BH, N] or None). The baseline a hybrid must
    beat (method='window' of favor.torch.attention; StreamingLLM's attention)."""
    sink = sink_mask(keep, q.shape[1], sinks, q.shape[0], q.device)
    out, _ = _band(q, k, v, keep, sink, sinks, causal, window, scale)
    return ratio(out, v.shape[-1])

