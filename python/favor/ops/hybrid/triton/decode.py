"""One hybrid decoder step in one fused Triton kernel: favor::hybrid_decode_step's CUDA kernel
on the HybridDecodeState (ops/hybrid/op.py: the C++ HybridDecoderState's layout),
advanced in place; the kernel reads the position on the device (the wrapper makes no host
sync; the op's eager checks of finite inputs and of the map read values on the host, as every
favor op's do).

Program (b, h), for the token t = position of batch row b (docs/math.md, "Hybrid attention";
the torch kernel, ops/hybrid/recurrent.py, step by step):
- push: the token becomes a sink when it is kept and the row has fewer than `sinks`; the token
  one window back leaves the ring slot t % W for the linear state when it was kept and not a
  sink (window 0: the token itself goes there, unless a sink), folded as decode.py's append
  (running max in log2 units, the row's decay clock ticking from its first folded token on);
  the token takes the slot.
- query: the exact terms over the ring and the sinks outside it (softmax scores at their max,
  the new token read from registers), the estimated terms from the linear state after the fold
  (decode.py's query, unnormalised, at its log scale c + log_max plus what the canonical map
  leaves out: the query's norm term, the features' constant, the decay clock), merged in log
  space as the batch op's parts (ops/hybrid/chunk.py, merge) with its zero-row rule.
(A scalar condition joins a vector one through tl.where: Triton's interpreter refuses the
mask that `&` of a scalar and a vector makes.)
Every program reads the per-row bookkeeping (ring flags, sink positions, clock, position)
before it writes anything; a barrier, then an arrival counter per row (atomic,
acquire-release) lets the row's last program write the row's flags and clock, and the last
program of the grid the position, so no program reads a value another has already advanced.
The linear state's sums are rewritten in place by the program that reads them: a barrier
between each tile's loads and its stores (a small tile holds an element in more than one
warp), the normaliser column only on the last value tile, after its last read. The ring
slot's old value (the folded token's) is read before the slot is overwritten at the end.
Not autotuned (num_warps 4): the autotuner's trial launches would each advance the state.
"""
import torch
import triton
import triton.language as tl

from ...attention.triton import params as P
from ...attention.triton.decode import _token_tile
from ...attention.triton.features import (LN2, LOG2E, amplitude, feature_tile, key_log2,
                                          key_offset, key_shift, query_features, query_log2,
                                          shift_terms)

NUM_WARPS = 4


@triton.jit
def _scores(keys_ptr, slot, xk, xq, valid, sub, scale, D, BLOCK_K: tl.constexpr,
            BLOCK_D: tl.constexpr, j0):
    """Scores scale q . k_j [BLOCK_K] of keys j0 .. j0 + BLOCK_K of one head's [count, D]
    block (valid: j < count), key `slot` replaced by the new token xk where `sub`."""
    j = j0 + tl.arange(0, BLOCK_K)
    d = tl.arange(0, BLOCK_D)
    keys = tl.load(keys_ptr + j[:, None] * D + d[None, :], mask=valid[:, None] & (d[None, :] < D),
                   other=0.0)
    keys = tl.where(tl.where(sub, j == slot, False)[:, None], xk, keys)
    return tl.sum(keys * xq, 1) * scale


@triton.jit
def _ring_scores(rk_ptr, rkeep_ptr, b, W, slot, kept, always, xk, xq, scale, D, j0,
                 BLOCK_W: tl.constexpr, BLOCK_D: tl.constexpr):
    """_scores of ring block j0 .. j0 + BLOCK_W of one head (rk_ptr: its [W, D] keys), -inf
    where the slot holds no live key (the new token, at `slot`, live when kept)."""
    j = j0 + tl.arange(0, BLOCK_W)
    live = tl.load(rkeep_ptr + b * W + j, mask=j < W, other=0) != 0
    live = tl.where(j == slot, kept, live) & (j < W)
    s = _scores(rk_ptr, slot, xk, xq, j < W, always, scale, D, BLOCK_W, BLOCK_D, j0)
    return tl.where(live, s, float("-inf"))


@triton.jit
def _values(values_ptr, slot, xv, count, sub, DV, e, j0, BLOCK_K: tl.constexpr):
    """Values [BLOCK_K, BLOCK_DV] of keys j0 .. of one head's [count, DV] block at columns e,
    row `slot` replaced by the new token's xv [BLOCK_DV] where `sub`."""
    j = j0 + tl.arange(0, BLOCK_K)
    valid = j < count
    vals = tl.load(values_ptr + j[:, None] * DV + e[None, :],
                   mask=valid[:, None] & (e[None, :] < DV), other=0.0)
    return tl.where(tl.where(sub, j == slot, False)[:, None], xv[None, :], vals)


@triton.jit
def _hybrid_decode(q_ptr, k_ptr, v_ptr, w_ptr, b_ptr, lw_ptr, r_ptr, lc_ptr, keep_ptr,
                   sums_ptr, lm_ptr, rows_ptr, pos_ptr, rk_ptr, rv_ptr, rkeep_ptr, rsink_ptr,
                   sk_ptr, sv_ptr, spos_ptr, cnt_ptr, y_ptr,
                   D, DV, F, m, H, B, W, S, W_SETS, B_SETS, L_SETS, R_SETS, C_SETS, norm_coef,
                   scale,
                   KIND: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_LOGW: tl.constexpr,
                   HAS_RATE: tl.constexpr, HAS_KEEP: tl.constexpr, ESTIMATE: tl.constexpr,
                   HAS_RING: tl.constexpr, HAS_SINKS: tl.constexpr, BLOCK_F: tl.constexpr,
                   BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_W: tl.constexpr,
                   BLOCK_S: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    b = bh // H
    t = tl.load(pos_ptr)
    always = t >= 0  # (a true scalar: the ring's slot always holds the new token)
    kept = always
    if HAS_KEEP:
        kept = tl.load(keep_ptr + b) != 0
    d = tl.arange(0, BLOCK_D)
    xk = tl.load(k_ptr + bh * D + d, mask=d < D, other=0.0).to(tl.float32)[None, :]
    xq = tl.load(q_ptr + bh * D + d, mask=d < D, other=0.0).to(tl.float32)[None, :]
    # the sinks: the row's count, whether the token joins them (at slot `count`)
    sidx = tl.arange(0, BLOCK_S)
    spos = tl.load(spos_ptr + b * S + sidx, mask=sidx < S, other=-1)
    count = tl.sum((spos >= 0).to(tl.int32), 0)
    is_sink = kept & (count < S)
    # the ring slot and the token folded into the linear state (window 0: the new one)
    slot = t % tl.maximum(W, 1)
    fold_call = t >= W  # a fold happens (window 0: every step)
    if HAS_RING:
        leaving = (tl.load(rkeep_ptr + b * W + slot) != 0) & \
            (tl.load(rsink_ptr + b * W + slot) == 0)
        fold = fold_call & leaving
        xf = tl.load(rk_ptr + (bh * W + slot) * D + d, mask=d < D, other=0.0)[None, :]
    else:
        fold = kept & (is_sink == 0)
        xf = xk
    rows = tl.load(rows_ptr + b)
    rows_new = rows
    # ---- the estimated part: fold, then the query's shift c (log2) and its log scale (nat)
    row = DV + 1
    mn = tl.full([], float("-inf"), tl.float64)
    c = tl.zeros([], tl.float32)
    r = tl.zeros([], tl.float32)
    off = tl.zeros([1], tl.float32)
    okv = tl.full([1], 0, tl.int1)
    wp = w_ptr + (bh % W_SETS) * m * D
    bp = b_ptr + (bh % B_SETS) * m
    lp = lw_ptr + (bh % L_SETS) * m
    L_lin = tl.full([], float("-inf"), tl.float64)
    if ESTIMATE:
        okv = tl.zeros([1], tl.int1) | fold
        rate = 0.0
        if HAS_RATE:
            rate = tl.load(r_ptr + bh % R_SETS)
        g = tl.sum(key_offset(xf, rows + tl.zeros([1], tl.int64), norm_coef, rate, HAS_RATE), 0)
        kmax = tl.full([], float("-inf"), tl.float32)
        for f0 in range(0, F, BLOCK_F):
            w, bias, lw, sign, fok = feature_tile(wp, bp, lp, f0 + tl.arange(0, BLOCK_F), m, F,
                                                  D, KIND, HAS_BIAS, HAS_LOGW, BLOCK_D)
            a = tl.sum(xf * w, 1)[None, :] + bias[None, :]
            kmax = tl.maximum(kmax, tl.max(tl.max(key_log2(a, sign, lw, KIND), 1), 0))
        lm2 = tl.load(lm_ptr + bh) * LOG2E
        mn = tl.where(fold, tl.maximum(lm2, kmax.to(tl.float64) + g), lm2)
        r = tl.where(lm2 == float("-inf"), 0.0, tl.exp2((lm2 - mn).to(tl.float32)))
        off = key_shift(tl.zeros([1], tl.float64) + g, mn, fold)
        rows_new = tl.where(fold_call & (fold | (rows > 0)), rows + 1, rows)
        if KIND != 2:
            c = tl.full([], float("-inf"), tl.float32)
            for f0 in range(0, F, BLOCK_F):
                f, sign, fok, phi, z, aq = _token_tile(wp, bp, lp, f0, m, F, D, xf, xq, off,
                                                      okv, r, sums_ptr, bh, row, DV, KIND,
                                                      HAS_BIAS, HAS_LOGW, BLOCK_F, BLOCK_D)
                c = tl.maximum(c, tl.max(shift_terms(tl.sum(query_log2(aq, sign), 0), z), 0))
        q64 = xq.to(tl.float64)
        extra = tl.sum(tl.sum(q64 * q64, 1), 0) * norm_coef + tl.load(lc_ptr + bh % C_SETS)
        if HAS_RATE:
            extra -= rate.to(tl.float64) * (rows_new - 1).to(tl.float64)
        L_lin = tl.where((mn == float("-inf")) | (c == float("-inf")), float("-inf"),
                         (c.to(tl.float64) + mn) * LN2 + extra)
    # ---- the exact part: the top score over the live ring and sinks
    top = tl.full([], float("-inf"), tl.float32)
    if HAS_RING:
        for j0 in range(0, W, BLOCK_W):
            s = _ring_scores(rk_ptr + bh * W * D, rkeep_ptr, b, W, slot, kept, always, xk, xq,
                             scale, D, j0, BLOCK_W, BLOCK_D)
            top = tl.maximum(top, tl.max(s, 0))
    if HAS_SINKS:
        spos_now = tl.where(tl.where(is_sink, sidx == count, False), t, spos)
        slive = (spos_now >= 0) & (spos_now <= t - W) & (sidx < S)
        ss = _scores(sk_ptr + bh * S * D, count, xk, xq, sidx < S, is_sink, scale, D, BLOCK_S,
                     BLOCK_D, 0)
        ss = tl.where(slive, ss, float("-inf"))
        top = tl.maximum(top, tl.max(ss, 0))
    safe = tl.where(top == float("-inf"), 0.0, top)
    L_e = top.to(tl.float64)
    S_top = tl.maximum(L_e, L_lin)
    S_top = tl.where(S_top == float("-inf"), 0.0, S_top)
    a_e = tl.exp((L_e - S_top).to(tl.float32))
    a_l = tl.exp((L_lin - S_top).to(tl.float32))
    # ---- the values: both parts' numerators per value tile, merged and written
    den_e = tl.zeros([], tl.float32)
    den_l = tl.zeros([], tl.float32)
    for dv0 in range(0, DV, BLOCK_DV):
        e = dv0 + tl.arange(0, BLOCK_DV)
        xv = tl.load(v_ptr + bh * DV + e, mask=e < DV, other=0.0).to(tl.float32)
        num_e = tl.zeros([BLOCK_DV], tl.float32)
        num_l = tl.zeros([BLOCK_DV], tl.float32)
        if HAS_RING:
            for j0 in range(0, W, BLOCK_W):
                s = _ring_scores(rk_ptr + bh * W * D, rkeep_ptr, b, W, slot, kept, always, xk,
                                 xq, scale, D, j0, BLOCK_W, BLOCK_D)
                p = tl.exp(s - safe)  # 0 where not live (-inf)
                vals = _values(rv_ptr + bh * W * DV, slot, xv, W, always, DV, e, j0, BLOCK_W)
                num_e += tl.sum(p[:, None] * vals, 0)
                den_e += tl.where(dv0 == 0, tl.sum(p, 0), 0.0)
        if HAS_SINKS:
            p = tl.where(slive, tl.exp(ss - safe), 0.0)
            vals = _values(sv_ptr + bh * S * DV, count, xv, S, is_sink, DV, e, 0, BLOCK_S)
            num_e += tl.sum(p[:, None] * vals, 0)
            den_e += tl.where(dv0 == 0, tl.sum(p, 0), 0.0)
        if ESTIMATE:
            if HAS_RING:
                xfv = tl.load(rv_ptr + (bh * W + slot) * DV + e, mask=e < DV, other=0.0)
            else:
                xfv = xv
            last_tile = dv0 + BLOCK_DV >= DV
            for f0 in range(0, F, BLOCK_F):
                f, sign, fok, phi, z, aq = _token_tile(wp, bp, lp, f0, m, F, D, xf, xq, off,
                                                      okv, r, sums_ptr, bh, row, DV, KIND,
                                                      HAS_BIAS, HAS_LOGW, BLOCK_F, BLOCK_D)
                if KIND == 2:
                    psi = tl.where(fok, tl.sum(amplitude(aq, f, m), 0), 0.0)
                else:
                    psi = query_features(tl.sum(query_log2(aq, sign), 0), tl.zeros_like(z) + c,
                                         z)
                den_l += tl.where(dv0 == 0, tl.sum(psi * z, 0), 0.0)
                mask = fok[:, None] & (e[None, :] < DV)
                ptrs = (bh * F + f[:, None]) * row + e[None, :]
                s_new = r * tl.load(sums_ptr + ptrs, mask=mask, other=0.0) + \
                    phi[:, None] * xfv[None, :]
                # every warp's loads of this tile (and of z) before any store: a tile smaller
                # than the warps' layout holds an element in more than one warp
                tl.debug_barrier()
                tl.store(sums_ptr + ptrs, s_new, mask=mask)
                num_l += tl.sum(psi[:, None] * s_new, 0)
                if last_tile:  # the normaliser after its last read
                    tl.store(sums_ptr + (bh * F + f) * row + DV, z, mask=fok)
        num = a_e * num_e + a_l * num_l
        den = a_e * den_e + a_l * den_l
        y = num / tl.where(den > 0, den, 1.0)
        fin = tl.max(tl.where(tl.abs(y) < float("inf"), 0.0, 1.0), 0) == 0.0
        y = tl.where((den > 0) & fin, y, 0.0)
        tl.store(y_ptr + bh * DV + e, y, mask=e < DV)
    # ---- this head's share of the state, then the row's (its last program) and the position
    if ESTIMATE:
        tl.store(lm_ptr + bh, mn * LN2)
    if HAS_RING:
        tl.store(rk_ptr + (bh * W + slot) * D + d, tl.sum(xk, 0), mask=d < D)
        e_all = tl.arange(0, BLOCK_DV)
        for dv0 in range(0, DV, BLOCK_DV):
            e = dv0 + e_all
            tl.store(rv_ptr + (bh * W + slot) * DV + e,
                     tl.load(v_ptr + bh * DV + e, mask=e < DV, other=0.0), mask=e < DV)
    if HAS_SINKS:
        tl.store(sk_ptr + (bh * S + count) * D + d, tl.sum(xk, 0),
                 mask=tl.where(is_sink, d < D, False))
        e_all = tl.arange(0, BLOCK_DV)
        for dv0 in range(0, DV, BLOCK_DV):
            e = dv0 + e_all
            tl.store(sv_ptr + (bh * S + count) * DV + e,
                     tl.load(v_ptr + bh * DV + e, mask=e < DV, other=0.0),
                     mask=tl.where(is_sink, e < DV, False))
    tl.debug_barrier()  # every warp's reads of the row's bookkeeping before the release
    arrived = tl.atomic_add(cnt_ptr + b, 1, sem="acq_rel")
    row_last = arrived == H - 1
    if HAS_RING:
        tl.store(rkeep_ptr + b * W + slot, kept.to(tl.uint8), mask=row_last)
        tl.store(rsink_ptr + b * W + slot, is_sink.to(tl.uint8), mask=row_last)
    if HAS_SINKS:
        tl.store(spos_ptr + b * S + count, t, mask=row_last & is_sink)
    if ESTIMATE:
        tl.store(rows_ptr + b, rows_new, mask=row_last)
    done = tl.atomic_add(cnt_ptr + B, 1, sem="acq_rel")
    tl.store(pos_ptr, t + 1, mask=done == B * H - 1)


_LOG_CONSTS = {}


def _log_const_tensor(log_const, device):
    """log_const as a float64 [sets] tensor on device: a tensor as it is (moved, cast), a
    float from a cache (one host-to-device copy per value and device, not one per step)."""
    if isinstance(log_const, torch.Tensor):
        return log_const.to(device=device, dtype=torch.float64).reshape(-1)
    key = (float(log_const), str(device))
    if key not in _LOG_CONSTS:
        _LOG_CONSTS[key] = torch.tensor([key[0]], dtype=torch.float64, device=device)
    return _LOG_CONSTS[key]


def hybrid_decode_step(state, q, k, v, W, bias, key_logw, rate, norm_coef, kind, log_const,
                       keep, heads, *, scale, window, sinks, estimate=True, block_f=None,
                       block_dv=None, block_w=None):
    """Push token (k, v) and query q, each [BH, D or Dv] float32 contiguous, on the
    HybridDecodeState's 11 tensors `state` (contiguous, on q's device), advanced in place;
    keep [B] (nonzero = the token takes part) or None; the map as decode.decode_step's;
    log_const the features' constant as a log (pair_log_const: a float or [sets] tensor);
    scale the exact scores' temperature; window, sinks the hybrid's sizes; estimate False:
    the window and the sinks alone. Returns y [BH, Dv] float32."""
    (sums, log_max, row_positions, position, ring_k, ring_v, ring_keep, ring_sink, sink_k,
     sink_v, sink_pos) = state
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.dtype != torch.float32 \
                or not t.is_contiguous():
            raise ValueError(f"{name}: must be a contiguous float32 [BH, D] tensor")
    bh, d = q.shape
    dv = v.shape[1]
    if tuple(k.shape) != (bh, d) or v.shape[0] != bh:
        raise ValueError(f"k, v: must be [BH, D] = [{bh}, {d}] and [BH, Dv]")
    (W, bias, key_logw, rate), sets, m, F, flags = P.map_parameters(
        W, bias, key_logw, rate, norm_coef, kind, bh, heads, d, q.device, True)
    batch = bh // heads
    want = {"sums": (sums, (batch, heads, F if estimate else 0, dv + 1), torch.float32),
            "ring_k": (ring_k, (batch, heads, window, d), torch.float32),
            "ring_v": (ring_v, (batch, heads, window, dv), torch.float32),
            "sink_k": (sink_k, (batch, heads, sinks, d), torch.float32),
            "sink_v": (sink_v, (batch, heads, sinks, dv), torch.float32),
            "sink_pos": (sink_pos, (batch, sinks), torch.int64),
            "position": (position, (1,), torch.int64),
            "log_max": (log_max, (batch, heads), torch.float64),
            "row_positions": (row_positions, (batch,), torch.int64),
            "ring_keep": (ring_keep, (batch, window), torch.uint8),
            "ring_sink": (ring_sink, (batch, window), torch.uint8)}
    for name, (t, shape, dtype) in want.items():
        if tuple(t.shape) != shape or t.dtype != dtype or not t.is_contiguous() \
                or t.device != q.device:
            raise ValueError(f"state.{name}: must be a contiguous {dtype} {list(shape)} "
                             "tensor on q's device")
    lc = _log_const_tensor(log_const, q.device)
    P.check_sets(lc.shape[0], "log_const", bh, heads)
    keep8 = None if keep is None else P.keep_mask(keep.reshape(batch, 1), batch, 1,
                                                 q.device).reshape(-1)
    bf = P.pow2(min(F, 64)) if block_f is None else block_f
    bdv = P.pow2(min(dv, 128)) if block_dv is None else block_dv
    bw = P.pow2(min(max(window, 1), 64)) if block_w is None else block_w
    for value, name in ((bf, "block_f"), (bdv, "block_dv"), (bw, "block_w")):
        if not isinstance(value, int) or value < 1 or value & (value - 1):
            raise ValueError(f"{name}: {value!r} must be a power of two")
    y = torch.empty(bh, dv, dtype=torch.float32, device=q.device)
    arrivals = torch.zeros(batch + 1, dtype=torch.int32, device=q.device)
    _hybrid_decode[(bh,)](
        q, k, v, W, bias, key_logw, rate, lc, W if keep8 is None else keep8, sums, log_max,
        row_positions, position, ring_k, ring_v, ring_keep, ring_sink, sink_k, sink_v,
        sink_pos, arrivals, y, d, dv, F, m, heads, batch, window, sinks, *sets, lc.shape[0],
        float(norm_coef), float(scale), KIND=kind, HAS_BIAS=flags["HAS_BIAS"],
        HAS_LOGW=flags["HAS_LOGW"], HAS_RATE=flags["HAS_RATE"], HAS_KEEP=keep is not None,
        ESTIMATE=bool(estimate), HAS_RING=window > 0, HAS_SINKS=sinks > 0, BLOCK_F=bf,
        BLOCK_D=P.pow2(d), BLOCK_DV=bdv, BLOCK_W=bw, BLOCK_S=P.pow2(max(sinks, 1), lo=2),
        num_warps=NUM_WARPS)
    return y
