"""Hybrid attention's exact part in Triton (the window inside the tile): for a tile of BM
queries, the keys of the tiles' windows in blocks of BN (scores on tl.dot, masked to each
row's window, the key mask and causal order) and then the sinks (a gathered block), with an
online max; out [BH, N, Dv + 1] = [sum exp(s - M) v | sum exp(s - M)] and M [BH, N], as the
C++ band kernel (src/cpu/band_attention.cpp) and the torch kernel (chunk._band) give them.
The estimated parts and the merge stay in torch (ops/hybrid/chunk.py); the backward is the
default kernel's (autograd through chunk.py), which recomputes.
Not timed on a GPU (none lent); tested under Triton's interpreter against the torch kernel.
"""
import torch
import triton
import triton.language as tl

from ...attention.triton.params import pow2

BM, BN = 16, 16


@triton.jit
def _online(s, ok, v, m_i, l_i, acc):
    """One block of keys into the online softmax: scores s [BM, K] (ok: the row's keys),
    values v [K, BDV]; returns the new (max, sum, accumulator)."""
    s = tl.where(ok, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.where(m_i == float("-inf"), 0.0, tl.exp(m_i - safe))
    p = tl.where(ok, tl.exp(s - safe[:, None]), 0.0)
    return m_new, l_i * alpha + tl.sum(p, 1), acc * alpha[:, None] + tl.dot(p, v)


@triton.jit
def _band_fwd(Q, K, V, KEEP, SINK, OUT, MAX, n, d, dv, scale, window, sinks,
              CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
              BDV: tl.constexpr, BS: tl.constexpr):
    tile = tl.program_id(0)
    bh = tl.program_id(1)
    rows = tile * BM + tl.arange(0, BM)
    live_r = rows < n
    dd = tl.arange(0, BD)
    de = tl.arange(0, BDV)
    q = tl.load(Q + bh * n * d + rows[:, None] * d + dd[None, :],
                mask=live_r[:, None] & (dd[None, :] < d), other=0.0)
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, BDV], tl.float32)
    first = tile * BM
    lo = tl.maximum(first - window + 1, 0)
    if CAUSAL:
        hi = tl.minimum(first + BM - 1, n - 1)
    else:
        hi = tl.minimum(first + BM + window - 2, n - 1)
    if window == 0:
        hi = lo - 1
    for start in range(lo, hi + 1, BN):
        cols = start + tl.arange(0, BN)
        live_c = cols <= hi
        k = tl.load(K + bh * n * d + cols[:, None] * d + dd[None, :],
                    mask=live_c[:, None] & (dd[None, :] < d), other=0.0)
        v = tl.load(V + bh * n * dv + cols[:, None] * dv + de[None, :],
                    mask=live_c[:, None] & (de[None, :] < dv), other=0.0)
        keep = tl.load(KEEP + bh * n + cols, mask=live_c, other=0) != 0
        s = tl.dot(q, tl.trans(k)) * scale
        gap = rows[:, None] - cols[None, :]
        if CAUSAL:
            inside = (gap < window) & (gap >= 0)
        else:
            inside = (gap < window) & (gap > -window)
        ok = inside & keep[None, :] & live_c[None, :] & live_r[:, None]
        m_i, l_i, acc = _online(s, ok, v, m_i, l_i, acc)
    # the sinks outside each row's window (and, causal, not after it)
    si = tl.arange(0, BS)
    pos = tl.load(SINK + bh * BS + si, mask=si < sinks, other=-1)
    has = pos >= 0
    at = tl.where(has, pos, 0)
    ks = tl.load(K + bh * n * d + at[:, None] * d + dd[None, :],
                 mask=has[:, None] & (dd[None, :] < d), other=0.0)
    vs = tl.load(V + bh * n * dv + at[:, None] * dv + de[None, :],
                 mask=has[:, None] & (de[None, :] < dv), other=0.0)
    s = tl.dot(q, tl.trans(ks)) * scale
    gap = rows[:, None] - pos[None, :]
    if CAUSAL:
        ok = has[None, :] & (gap >= window) & live_r[:, None]
    else:
        ok = has[None, :] & ((gap >= window) | (gap <= -window)) & live_r[:, None]
    m_i, l_i, acc = _online(s, ok, vs, m_i, l_i, acc)
    out = OUT + bh * n * (dv + 1) + rows[:, None] * (dv + 1) + de[None, :]
    tl.store(out, acc, mask=live_r[:, None] & (de[None, :] < dv))
    tl.store(OUT + bh * n * (dv + 1) + rows * (dv + 1) + dv, l_i, mask=live_r)
    tl.store(MAX + bh * n + rows, m_i, mask=live_r)


def band(q, k, v, keep, sink, sinks, causal, w, scale):
    """chunk._band's contract on the fused kernel: (out [BH, N, Dv + 1] float32, M [BH, N]
    float64, -inf where a row has no exact key); q, k, v [BH, N, D or Dv], keep [BH, N]
    bool or None, sink [BH, N] bool (the sinks)."""
    bh, n, d = q.shape
    dv = v.shape[-1]
    bs = pow2(max(sinks, 1))
    # each row's sink positions, ascending, -1 past the last
    idx = torch.arange(n, device=q.device).expand(bh, n)
    pos = torch.where(sink, idx, torch.full_like(idx, n)).sort(-1).values[:, :bs]
    if pos.shape[1] < bs:
        pos = torch.cat([pos, pos.new_full((bh, bs - pos.shape[1]), n)], 1)
    pos = torch.where(pos >= n, -1, pos).to(torch.int32).contiguous()
    keep_i = (torch.ones(bh, n, dtype=torch.int8, device=q.device) if keep is None
              else keep.to(torch.int8)).contiguous()
    out = torch.empty(bh, n, dv + 1, dtype=torch.float32, device=q.device)
    top = torch.empty(bh, n, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(n, BM), bh)
    _band_fwd[grid](q.float().contiguous(), k.float().contiguous(), v.float().contiguous(),
                    keep_i, pos, out, top, n, d, dv, float(scale), int(w), int(sinks),
                    CAUSAL=bool(causal), BM=BM, BN=BN, BD=pow2(d), BDV=pow2(dv + 1), BS=bs)
    return out, top.double()
