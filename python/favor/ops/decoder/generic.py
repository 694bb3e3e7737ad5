"""favor::decode_step's torch path (any device): append tokens to the decoder state and query
it in plain torch operations, on the C++ Decoder's state layout (ops/decoder/op.py): sums
[B, H, F, Dv + 1] float32 ([S | s] relative to exp(log_max)), log_max [B, H] float64 (-inf:
empty), row_positions [B] int64 (a row's decay clock: its tokens from its first kept one on,
clock_ticks), position [1] int64. A
state moves between devices and backends with .to(device). Functional: new tensors out."""
import torch

from ..attention import generic
from ..attention.canonical import TRIG


def clock_ticks(keep, clock, b, t, device):
    """[B, T] int64: whether each token ticks its row's decay clock (C++'s
    kernels::clock_ticks): every token from the row's first kept one on (a row whose clock
    is past 0 has started), none before it; keep [B, T] bool or None (all kept)."""
    if keep is None:
        return torch.ones(b, t, dtype=torch.int64, device=device)
    started = (clock[:, None] > 0) | (torch.cumsum(keep.long(), 1) > 0)
    return started.long()


def append(state, k, v, cm, key_mask=None):
    """The state after appending k [B, H, T, D], v [B, H, T, Dv] (float32) under the
    CanonicalMap cm; key_mask [B, T] nonzero = the token takes part (a masked token adds no
    key; after the row's first kept token it ticks the row's clock, clock_ticks)."""
    sums, log_max, row_positions, position = state
    b, h, t, _ = k.shape
    keep = None if key_mask is None else key_mask.to(k.device).ne(0)
    ticks = clock_ticks(keep, row_positions.to(k.device), b, t, k.device)          # [B, T]
    clocks = row_positions.to(k.device)[:, None] + torch.cumsum(ticks, 1) - ticks  # [B, T]
    positions = clocks.double().repeat_interleave(h, 0)
    keep_bh = None if keep is None else keep.repeat_interleave(h, 0)
    phi, scale = generic.key_features(k.reshape(b * h, t, -1), cm, keep_bh, False, positions)
    new_max = scale[:, 0].reshape(b, h)
    top = torch.maximum(log_max, new_max)
    safe = top.masked_fill(torch.isinf(top), 0.0)
    old_factor = torch.exp(log_max - safe).float().masked_fill(torch.isinf(log_max), 0.0)
    new_factor = torch.exp(new_max - safe).float().masked_fill(torch.isinf(new_max), 0.0)
    vx = torch.cat([v, torch.ones_like(v[..., :1])], -1).reshape(b * h, t, -1)
    added = (phi.transpose(-1, -2) @ vx).reshape(sums.shape)
    sums = sums * old_factor[..., None, None] + added * new_factor[..., None, None]
    return sums, top, row_positions.to(k.device) + ticks.sum(1), position + t


def query(state, q, cm):
    """y [B, H, T, Dv] float32: every query of q [B, H, T, D] reads the current state; an
    empty head gives zeros."""
    sums = state[0]
    b, h, t, _ = q.shape
    sx = sums.reshape(b * h, *sums.shape[2:])
    lq = generic.query_logits(q.reshape(b * h, t, -1), cm)
    dv = sx.shape[-1] - 1
    psi = lq if cm.kind == TRIG else generic.shifted(lq, sx[..., dv].unsqueeze(1))
    return generic.ratio(psi @ sx, dv).reshape(b, h, t, dv)


def decode_step(state, q, k, v, cm, key_mask=None):
    """(y, new state): append, then query (as favor::decode_step)."""
    new = append(state, k, v, cm, key_mask)
    return query(new, q, cm), new


def prefill(state, q, k, v, cm, key_mask=None):
    """(y, new state) of a prompt from an empty state without decay: causal attention over
    q, k, v [B, H, T, D or Dv] with the key features computed once, and the state they leave
    (the same features at the last token's scale: sum_j phi_j exp(M_j - M_T) [v_j | 1], the
    stabiliser M_T). Equal to token-by-token append and query up to float rounding (the sums
    run in another order), as the C++ Decoder::prefill."""
    sums, log_max, row_positions, position = state
    b, h, t, _ = k.shape
    keep = None if key_mask is None else key_mask.to(k.device).ne(0)
    keep_bh = None if keep is None else keep.repeat_interleave(h, 0)
    phi, scale = generic.key_features(k.reshape(b * h, t, -1), cm, keep_bh, True)
    vx = torch.cat([v, torch.ones_like(v[..., :1])], -1).reshape(b * h, t, -1)
    dv = v.shape[-1]
    out = generic.linear_core(generic.query_logits(q.reshape(b * h, t, -1), cm),
                              cm.kind != TRIG, phi, scale, vx, True, dv)
    y = generic.ratio(out, dv).reshape(b, h, t, dv)
    last = scale[:, -1:]                                                  # M_T [BH, 1]
    empty = torch.isinf(last)
    carry = torch.exp((scale - last.masked_fill(empty, 0.0)).masked_fill(torch.isinf(scale),
                                                                         float("-inf")))
    added = (phi * carry.float().unsqueeze(-1)).transpose(-1, -2) @ vx    # [BH, F, Dv + 1]
    added = added.masked_fill(empty.unsqueeze(-1), 0.0)
    ticks = clock_ticks(keep, row_positions.to(k.device), b, t, k.device).sum(1)
    new = (added.reshape(sums.shape), last.reshape(log_max.shape),
           row_positions.to(k.device) + ticks, position + t)
    return y, new
