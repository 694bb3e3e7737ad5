"""favor::hybrid_decode_step's torch kernel (any device): hybrid attention's decoding state
(op.py, HybridDecodeState: the C++ HybridDecoderState's layout) advanced in
place by plain torch operations.

- the ring of the last `window` keys and values (slot t % window holds token t) with, per row,
  whether the token takes part (key mask) and whether it is a sink (uint8 0 or 1);
- the sinks: each row's first `sinks` kept tokens (left padding moves them), their keys,
  values and positions (-1: none yet);
- the linear state of every other token that has left the window (the plain decoder's sums,
  log_max, row_positions: a token is folded in as phi(k) [v | 1]^T when it leaves the window,
  so its decay runs from the window's edge, as favor.torch.attention's).
A step pushes the new token (folding the one `window` tokens back into the linear state) and
reads the exact part from the ring and the sinks and the estimated part from the linear state,
merged in log space like the attention op's parts. The kernel is opaque to torch.compile (a
custom op), so it reads the position as a Python int.
"""
import math

import torch

from ..attention import generic
from ..attention.canonical import TRIG
from ..decoder import generic as linear
from .chunk import merge, per_head, row_terms


def _fold(st, k, v, keep, cm):
    """The tokens k, v [B, H, T, .] (keep [B, T]) into the linear state, in place."""
    no_position = torch.zeros(1, dtype=torch.int64, device=k.device)
    sums, top, rows, _ = linear.append((st.sums, st.log_max, st.row_positions, no_position), k,
                                       v, cm, keep)
    st.sums.copy_(sums)
    st.log_max.copy_(top)
    st.row_positions.copy_(rows)


def push(st, k, v, keep, cm, window, sinks, estimate):
    """Token `position` (k, v [B, H, 1, .], keep [B] bool) enters: the token one window back
    leaves the ring for the linear state (sinks never do), the first kept tokens become
    sinks."""
    t = int(st.position[0])
    count = (st.sink_pos >= 0).sum(1)
    sink = keep & (count < sinks)
    rows = sink.nonzero().squeeze(1)
    if rows.numel():
        slot = count[rows]
        st.sink_k[rows, :, slot] = k[rows, :, 0]
        st.sink_v[rows, :, slot] = v[rows, :, 0]
        st.sink_pos[rows, slot] = t
    if window == 0:
        if estimate:
            _fold(st, k, v, (keep & ~sink)[:, None], cm)
    else:
        slot = t % window
        if t >= window and estimate:
            leaving = st.ring_keep[:, slot].bool() & ~st.ring_sink[:, slot].bool()
            _fold(st, st.ring_k[:, :, slot:slot + 1], st.ring_v[:, :, slot:slot + 1],
                  leaving[:, None], cm)
        st.ring_k[:, :, slot] = k[:, :, 0]
        st.ring_v[:, :, slot] = v[:, :, 0]
        st.ring_keep[:, slot] = keep.to(torch.uint8)
        st.ring_sink[:, slot] = sink.to(torch.uint8)
    st.position.add_(1)


def build(st, k, v, keep, cm, window, sinks, estimate):
    """The state after the prompt k, v [B, H, T, .] (keep [B, T] bool) from an empty one, in
    bulk: the sinks, the tokens before the last `window` into the linear state at once, the
    last `window` into the ring."""
    t = k.shape[2]
    rank = keep.long().cumsum(1)
    sink = keep & (rank <= sinks)                                             # [B, T]
    for b in range(k.shape[0]):
        pos = sink[b].nonzero().squeeze(1)
        st.sink_k[b, :, :len(pos)] = k[b, :, pos]
        st.sink_v[b, :, :len(pos)] = v[b, :, pos]
        st.sink_pos[b, :len(pos)] = pos
    folded = max(t - window, 0)
    if folded and estimate:
        _fold(st, k[:, :, :folded], v[:, :, :folded], (keep & ~sink)[:, :folded], cm)
    for p in range(folded, t):
        slot = p % window
        st.ring_k[:, :, slot] = k[:, :, p]
        st.ring_v[:, :, slot] = v[:, :, p]
        st.ring_keep[:, slot] = keep[:, p].to(torch.uint8)
        st.ring_sink[:, slot] = sink[:, p].to(torch.uint8)
    st.position.fill_(t)


def _exact_part(st, q, scale, window):
    """The window's and the sinks' terms for q [B, H, T, D]: ([num | den] [B, H, T, Dv + 1],
    their log scale [B, H, T] float64)."""
    last = st.position[0] - 1
    keys = torch.cat([st.ring_k, st.sink_k], 2)
    values = torch.cat([st.ring_v, st.sink_v], 2)
    outside = (st.sink_pos >= 0) & (st.sink_pos <= last - window)       # sinks not in the ring
    live = torch.cat([st.ring_keep.bool(), outside], 1)                  # [B, w + s]
    scores = (q @ keys.transpose(-1, -2)) * scale                        # [B, H, T, w + s]
    scores = scores.masked_fill(~live[:, None, None, :], -math.inf)
    top = scores.amax(-1, keepdim=True)
    safe = top.masked_fill(torch.isinf(top), 0.0)
    p = torch.exp(scores - safe)
    num = torch.cat([p @ values, p.sum(-1, keepdim=True)], -1)
    return num, top.squeeze(-1).double()


def _linear_part(st, q, cm, log_const, dv):
    """The estimated terms for q [B, H, T, D] from the linear state, at their full log scale
    (what the kernels leave out, the batch op's row_terms: the query's norm term, the
    features' constant, the query's decay clock: the last folded token's)."""
    b, h, tq, _ = q.shape
    sx = st.sums.reshape(b * h, *st.sums.shape[2:])
    lq = generic.query_logits(q.reshape(b * h, tq, -1), cm)
    if cm.kind == TRIG:
        psi, c = lq, torch.zeros(b * h, tq, 1, dtype=lq.dtype, device=q.device)
    else:
        psi, c = generic.shifted(lq, sx[..., dv].unsqueeze(1), with_shift=True)
    out = (psi @ sx).reshape(b, h, tq, -1)
    # the batch rule's terms (row_terms), at the query's clock: the last folded token's
    extra = row_terms(q.reshape(b * h, tq, -1), cm, log_const, False).reshape(b, h, tq)
    if cm.rate is not None:
        rate = per_head(cm.rate.to(q.device), b * h).reshape(b, h)
        extra = extra - (rate * (st.row_positions - 1).double()[:, None])[..., None]
    scale = c.reshape(b, h, tq).double() + st.log_max[..., None] + extra
    return out, scale.masked_fill(torch.isinf(st.log_max)[..., None], -math.inf)


def query(st, q, cm, scale, window, log_const=None):
    """[B, H, T, Dv] float32: each query reads the current state (the ring as it is); the
    linear state too unless log_const is None (the window and the sinks alone:
    pair_log_const's constant otherwise)."""
    dv = st.ring_v.shape[-1]
    parts = [_exact_part(st, q, scale, window)]
    if log_const is not None:
        parts.append(_linear_part(st, q, cm, log_const, dv))
    return merge(parts, dv)
