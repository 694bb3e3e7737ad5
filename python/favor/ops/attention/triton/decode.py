"""One decoder step in one fused Triton kernel per head: append a token to the state [S | s]
and query it (the state layout of favor._core.Decoder.state(); canonical map as in
features.py).

State: sums [BH, F, Dv + 1] fp32 = [S | s] relative to exp(log_max), log_max [BH] float64
(-inf when empty), row_positions [B] int64 (each batch row's decay clock: +1 per token from
its first kept one on),
position (int, +1 per token). Append (kept token t of row b, at position row_positions[b]):
M' = max(log_max, max_f l_tf); sums = exp(log_max - M') sums + phi_t(M') [v_t | 1].
Query: c = max over live f (s_f >= FLT_MIN) of (+-a_f(q) + log s_f), psi, y = psi S / psi s
(zeros where the denominator is not > 0 or y not finite; an empty head gives zeros).
The step is functional: new tensors are returned and the inputs are left as they were (a
generation loop can carry the state as tensors; an in-place variant would save one copy of
sums per step but aliases the caller's state).
One row per program: the products are elementwise fp32 (no tl.dot, so no tile minimum and no
tf32 rounding); the kernel is memory-bound on reading and writing sums, read once per Dv tile.
"""
import torch
import triton
import triton.language as tl

from . import params as P
from .features import (LN2, LOG2E, amplitude, feature_tile, key_features, key_log2,
                       key_offset, key_shift, query_features, query_log2, shift_terms)

NUM_WARPS = 4


@triton.jit
def _row(x, w, bias):
    """a = W x + bias for one row x [1, BLOCK_D]: [1, BLOCK_F] (elementwise, exact fp32)."""
    return (tl.sum(x * w, 1) + bias)[None, :]


@triton.jit
def _token_tile(wp, bp, lp, f0, m, F, D, xk, xq, off, okv, r, sums_ptr, bh, row, DV,
                KIND: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_LOGW: tl.constexpr,
                BLOCK_F: tl.constexpr, BLOCK_D: tl.constexpr):
    """One feature tile of the step, for both walks of _decode: the new token's key features
    phi at the new max, the normaliser z after the append (the old s rescaled by r, plus
    phi), and the query's projection aq [1, BLOCK_F]. (f, sign, fok, phi, z, aq)."""
    f = f0 + tl.arange(0, BLOCK_F)
    w, bias, lw, sign, fok = feature_tile(wp, bp, lp, f, m, F, D, KIND, HAS_BIAS, HAS_LOGW,
                                          BLOCK_D)
    ak = _row(xk, w, bias)
    phi = tl.sum(key_features(key_log2(ak, sign, lw, KIND), off, okv, ak, f, m, KIND), 0)
    z = r * tl.load(sums_ptr + (bh * F + f) * row + DV, mask=fok, other=0.0) + phi
    return f, sign, fok, phi, z, _row(xq, w, bias)


@P.tuned(["D", "F", "DV"])
@triton.jit
def _decode(q_ptr, k_ptr, v_ptr, w_ptr, b_ptr, lw_ptr, r_ptr, keep_ptr, sums_ptr, lm_ptr,
            pos_ptr, y_ptr, out_ptr, nlm_ptr,
            D, DV, F, m, H, W_SETS, B_SETS, L_SETS, R_SETS, norm_coef,
            KIND: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_LOGW: tl.constexpr,
            HAS_RATE: tl.constexpr, HAS_KEEP: tl.constexpr, BLOCK_F: tl.constexpr,
            BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Head bh: three sweeps over feature tiles (the token's max; the new s and the shift c;
    the new S, the numerator and the denominator)."""
    bh = tl.program_id(0).to(tl.int64)
    b = bh // H
    okv = tl.full([1], 1, tl.int32) != 0
    if HAS_KEEP:
        okv = okv & (tl.load(keep_ptr + b + tl.zeros([1], tl.int64)) != 0)
    d = tl.arange(0, BLOCK_D)
    xk = tl.load(k_ptr + bh * D + d, mask=d < D, other=0.0).to(tl.float32)[None, :]
    xq = tl.load(q_ptr + bh * D + d, mask=d < D, other=0.0).to(tl.float32)[None, :]
    rate = 0.0
    if HAS_RATE:
        rate = tl.load(r_ptr + bh % R_SETS)
    pos = tl.load(pos_ptr + b + tl.zeros([1], tl.int64))
    g = tl.sum(key_offset(xk, pos, norm_coef, rate, HAS_RATE), 0)
    wp = w_ptr + (bh % W_SETS) * m * D
    bp = b_ptr + (bh % B_SETS) * m
    lp = lw_ptr + (bh % L_SETS) * m
    kmax = tl.full([], float("-inf"), tl.float32)
    for f0 in range(0, F, BLOCK_F):
        w, bias, lw, sign, fok = feature_tile(wp, bp, lp, f0 + tl.arange(0, BLOCK_F), m, F, D,
                                              KIND, HAS_BIAS, HAS_LOGW, BLOCK_D)
        kmax = tl.maximum(kmax, tl.max(tl.max(key_log2(_row(xk, w, bias), sign, lw, KIND), 1), 0))
    lm2 = tl.load(lm_ptr + bh) * LOG2E
    kept = tl.max(okv.to(tl.int32), 0) != 0
    mn = tl.where(kept, tl.maximum(lm2, kmax.to(tl.float64) + g), lm2)
    r = tl.where(lm2 == float("-inf"), 0.0, tl.exp2((lm2 - mn).to(tl.float32)))
    off = key_shift(tl.zeros([1], tl.float64) + g, mn, kept)
    tl.store(nlm_ptr + bh, mn * LN2)
    row = DV + 1
    c = tl.zeros([], tl.float32)
    if KIND != 2:
        c = tl.full([], float("-inf"), tl.float32)
        for f0 in range(0, F, BLOCK_F):
            f, sign, fok, phi, z, aq = _token_tile(wp, bp, lp, f0, m, F, D, xk, xq, off, okv,
                                                  r, sums_ptr, bh, row, DV, KIND, HAS_BIAS,
                                                  HAS_LOGW, BLOCK_F, BLOCK_D)
            c = tl.maximum(c, tl.max(shift_terms(tl.sum(query_log2(aq, sign), 0), z), 0))
    den = tl.zeros([], tl.float32)
    for dv0 in range(0, DV, BLOCK_DV):
        e = dv0 + tl.arange(0, BLOCK_DV)
        v = tl.load(v_ptr + bh * DV + e, mask=e < DV, other=0.0).to(tl.float32)
        num = tl.zeros([BLOCK_DV], tl.float32)
        for f0 in range(0, F, BLOCK_F):
            f, sign, fok, phi, z, aq = _token_tile(wp, bp, lp, f0, m, F, D, xk, xq, off, okv,
                                                  r, sums_ptr, bh, row, DV, KIND, HAS_BIAS,
                                                  HAS_LOGW, BLOCK_F, BLOCK_D)
            if KIND == 2:
                psi = tl.where(fok, tl.sum(amplitude(aq, f, m), 0), 0.0)
            else:
                psi = query_features(tl.sum(query_log2(aq, sign), 0), tl.zeros_like(z) + c, z)
            den += tl.where(dv0 == 0, tl.sum(psi * z, 0), 0.0)
            if dv0 == 0:
                tl.store(out_ptr + (bh * F + f) * row + DV, z, mask=fok)
            mask = fok[:, None] & (e[None, :] < DV)
            ptrs = (bh * F + f[:, None]) * row + e[None, :]
            s_new = r * tl.load(sums_ptr + ptrs, mask=mask, other=0.0) + phi[:, None] * v[None, :]
            tl.store(out_ptr + ptrs, s_new, mask=mask)
            num += tl.sum(psi[:, None] * s_new, 0)
        y = num / tl.where(den > 0, den, 1.0)
        fin = tl.max(tl.where(tl.abs(y) < float("inf"), 0.0, 1.0), 0) == 0.0
        y = tl.where(den > 0, tl.where(fin, y, 0.0), 0.0)
        tl.store(y_ptr + bh * DV + e, y.to(y_ptr.dtype.element_ty), mask=e < DV)


def decode_step(sums, log_max, row_positions, position, q, k, v, W, bias, key_logw, rate,
                norm_coef, kind, keep, heads, *, precision="tf32", block_f=None, block_dv=None):
    """Append token (k, v) and query q, each [BH, 1, D or Dv] (fp32 / fp16 / bf16,
    contiguous), on the state (sums [BH, F, Dv + 1] fp32, log_max [BH] float64, row_positions
    [B] int64, position an int); keep [B] or [B, 1] (nonzero = the token takes part) or None;
    the map as in attend.forward (rate = -log gamma per head, allowed: decoding is causal).
    Returns (y [BH, 1, Dv] in q's dtype, sums, log_max, row_positions, position), new tensors
    (inputs unchanged). precision is accepted for symmetry with forward and has no effect
    (one row: elementwise fp32 products)."""
    P.check_rows(q, "q", None, n=1)
    bh, _, d = q.shape
    P.check_rows(k, "k", bh, n=1, d=d)
    P.check_rows(v, "v", bh, n=1)
    dv = v.shape[2]
    P.check_precision(precision)
    (W, bias, key_logw, rate), sets, m, F, flags = P.map_parameters(
        W, bias, key_logw, rate, norm_coef, kind, bh, heads, d, q.device, True)
    batch = bh // heads
    if (not isinstance(sums, torch.Tensor) or tuple(sums.shape) != (bh, F, dv + 1)
            or sums.dtype != torch.float32 or not sums.is_contiguous()):
        raise ValueError(f"sums: must be a contiguous float32 [BH, F, Dv + 1] = "
                         f"[{bh}, {F}, {dv + 1}] tensor")
    if (not isinstance(log_max, torch.Tensor) or tuple(log_max.shape) != (bh,)
            or log_max.dtype != torch.float64 or not log_max.is_contiguous()):
        raise ValueError(f"log_max: must be a contiguous float64 [BH] = [{bh}] tensor")
    if (not isinstance(row_positions, torch.Tensor) or tuple(row_positions.shape) != (batch,)
            or row_positions.dtype != torch.int64 or not row_positions.is_contiguous()):
        raise ValueError(f"row_positions: must be a contiguous int64 [B] = [{batch}] tensor")
    if not isinstance(position, int) or position < 0:
        raise ValueError(f"position: {position!r} must be an int >= 0")
    if keep is not None and isinstance(keep, torch.Tensor) and keep.dim() == 2:
        keep = keep.reshape(-1)
    if keep is not None and (not isinstance(keep, torch.Tensor) or tuple(keep.shape) != (batch,)):
        raise ValueError(f"keep: must be a [B] or [B, 1] tensor, B = {batch}")
    keep8 = None if keep is None else P.keep_mask(keep[:, None], batch, 1, q.device).reshape(-1)
    bf = P.pow2(min(F, 64)) if block_f is None else block_f
    bdv = P.pow2(min(dv, 128)) if block_dv is None else block_dv
    y = torch.empty(bh, 1, dv, dtype=q.dtype, device=q.device)
    out = torch.empty(bh, F, dv + 1, dtype=torch.float32, device=q.device)
    nlm = torch.empty(bh, dtype=torch.float64, device=q.device)
    _decode[(bh,)](q, k, v, W, bias, key_logw, rate, W if keep8 is None else keep8, sums,
                   log_max, row_positions, y, out, nlm, d, dv, F, m, heads, *sets,
                   float(norm_coef), KIND=kind, HAS_BIAS=flags["HAS_BIAS"],
                   HAS_LOGW=flags["HAS_LOGW"], HAS_RATE=flags["HAS_RATE"],
                   HAS_KEEP=keep is not None, BLOCK_F=bf, BLOCK_D=P.pow2(d),
                   BLOCK_DV=bdv, **P.launch_options(NUM_WARPS))
    # the clock ticks from the row's first kept token on (C++'s kernels::clock_ticks)
    new_rows = row_positions + (1 if keep8 is None else
                                ((keep8 != 0) | (row_positions > 0)).to(torch.int64))
    return y, out, nlm, new_rows, position + 1
