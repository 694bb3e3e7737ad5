"""The tile helpers of the fused backward (gradients.py): loads, the feature prologue on a
tile of base features (features.py's, the one the forward and the decode step use: f and
m + f together, so the +-a / sin-cos pairs meet), the query features after the shift, and
the pieces of the chain rule through the features (dpsi, da, dphi). @triton.jit functions
inlined into gradients.py's kernels. Units as in features.py: log-features, maxima M and
shifts c in log2 units, the key offsets g_j - M formed in float64 and rounded once; a stays
natural (a feature is exp2(+-a log2 e + ...), so d phi / d a = +-phi as in natural units).
"""
import triton
import triton.language as tl

from .features import (feature_tile, key_exp, key_log2, key_max, key_offset, key_shift,
                       project, query_features, query_log2, shift_terms)

_NEG = tl.constexpr(-1.0e30)  # "no key yet": finite, so NEG - NEG = 0, never NaN

EXP, EXP_PM, TRIG = 0, 1, 2


@triton.jit
def _head_map(w_ptr, b_ptr, klw_ptr, rate_ptr, bh, m, w_sets, b_sets, l_sets, r_sets, D):
    """The map parameters of head bh: set bh % sets of W, bias, key_logw and rate."""
    return (w_ptr + (bh % w_sets) * m * D, b_ptr + (bh % b_sets) * m,
            klw_ptr + (bh % l_sets) * m, rate_ptr + bh % r_sets)


@triton.jit
def _load_rows(ptr, rows, row_ok, ncols, BC: tl.constexpr):
    """rows of a contiguous [*, ncols] matrix as an fp32 [len(rows), BC] block, zero-padded."""
    cols = tl.arange(0, BC)
    mask = row_ok[:, None] & (cols < ncols)[None, :]
    return tl.load(ptr + rows[:, None] * ncols + cols[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _kept(keep_ptr, rows, row_ok, HAS_KEEP: tl.constexpr):
    """Which rows take part: inside the sequence and, with a mask, kept (nonzero)."""
    if HAS_KEEP:
        return row_ok & (tl.load(keep_ptr + rows, mask=row_ok, other=0) != 0)
    return row_ok


@triton.jit
def _query_tile(x, w_ptr, b_ptr, f, m, D: tl.constexpr, KIND: tl.constexpr,
                HAS_BIAS: tl.constexpr, PREC: tl.constexpr):
    """The prologue of query rows x on base features f (< m): (a, lq, w), a = x W[f]^T +
    bias[f] (TRIG's angle), lq = a log2 e the log2-features of f (-lq those of m + f) and
    W's rows (zero past m)."""
    w, bias, lw, sign, fm = feature_tile(w_ptr, b_ptr, b_ptr, f, m, m, D, KIND, HAS_BIAS, False,
                                         D)
    a = project(x, w, bias, PREC)
    return a, query_log2(a, sign), w


@triton.jit
def _key_tile(x, w_ptr, b_ptr, klw_ptr, f, m, D: tl.constexpr, KIND: tl.constexpr,
              HAS_BIAS: tl.constexpr, HAS_KLW: tl.constexpr, PREC: tl.constexpr):
    """The prologue of key rows x on base features f (< m): (a, lo, hi, w), lo and hi the
    log2-features of f (+a) and m + f (-a; hi = lo for TRIG, the key log weight alone, and
    for EXP, which has no m + f) without g_j, -inf past m."""
    w, bias, lw, sign, fm = feature_tile(w_ptr, b_ptr, klw_ptr, f, m, m, D, KIND, HAS_BIAS,
                                         HAS_KLW, D)
    a = project(x, w, bias, PREC)
    lo = key_log2(a, sign, lw, KIND)
    hi = lo
    if KIND == 1:
        hi = key_log2(-a, sign, lw, KIND)
    return a, lo, hi, w


@triton.jit
def _key_offset(x, rows, norm_coef, rate_ptr, HAS_RATE: tl.constexpr):
    """features.key_offset's g_j (log2, float64) of key rows x at positions rows, the rate
    read from rate_ptr."""
    rate = 0.0
    if HAS_RATE:
        rate = tl.load(rate_ptr)
    return key_offset(x, rows, norm_coef, rate, HAS_RATE)


@triton.jit
def _key_row_max(lo, hi, g, kept, KIND: tl.constexpr):
    """Each key's largest log2-feature over the tile's pair (features.key_max)."""
    if KIND == 1:
        return key_max(tl.maximum(lo, hi), g, kept)
    return key_max(lo, g, kept)


@triton.jit
def _key_features(lo, hi, a, off, kept, KIND: tl.constexpr):
    """(e_lo, e_hi, phi_lo, phi_hi): e = exp2(l - M) = key_exp(l, off) for f and m + f (0
    where the key is not kept or the feature past m), phi = e times TRIG's amplitude (sin a
    for f, cos a for m + f)."""
    e_lo = key_exp(lo, off, kept)
    if KIND == 0:
        e_hi = e_lo
    else:
        e_hi = key_exp(hi, off, kept)
    if KIND == 2:
        return e_lo, e_hi, e_lo * tl.sin(a), e_hi * tl.cos(a)
    return e_lo, e_hi, e_lo, e_hi


@triton.jit
def _normaliser(bscale, s_ptr, f, fm, m, T, phik_lo, phik_hi, KIND: tl.constexpr,
                CAUSAL: tl.constexpr, PREC: tl.constexpr):
    """The key normaliser each query row reads, [rows, BF] for features f and m + f: the
    stored state's s rescaled by bscale, plus (causal) the chunk's own keys T phi."""
    p_lo = bscale[:, None] * tl.load(s_ptr + f, mask=fm, other=0.0)[None, :]
    p_hi = p_lo
    if KIND != 0:
        p_hi = bscale[:, None] * tl.load(s_ptr + m + f, mask=fm, other=0.0)[None, :]
    if CAUSAL:
        p_lo += tl.dot(T, phik_lo, input_precision=PREC)
        if KIND != 0:
            p_hi += tl.dot(T, phik_hi, input_precision=PREC)
    return p_lo, p_hi


@triton.jit
def _query_shift(c, lq, p_lo, p_hi, KIND: tl.constexpr):
    """The row shift c (log2) after one tile: the max with lq + log2 p over live features
    (features.shift_terms), -lq + log2 p_hi for EXP_PM's m + f."""
    c = tl.maximum(c, tl.max(shift_terms(lq, p_lo), 1))
    if KIND == 1:
        c = tl.maximum(c, tl.max(shift_terms(-lq, p_hi), 1))
    return c


@triton.jit
def _query_features(a, lq, c, p_lo, p_hi, KIND: tl.constexpr):
    """psi for features f and m + f: exp2(+-lq - c) where the feature is live (its key sum
    p >= FLT_MIN; features.query_features), 0 where dead (past m: p = 0); TRIG [sin a, cos a]."""
    if KIND == 2:
        return tl.sin(a), tl.cos(a)
    lo = query_features(lq, c[:, None], p_lo)
    hi = lo
    if KIND == 1:
        hi = query_features(-lq, c[:, None], p_hi)
    return lo, hi


@triton.jit
def _chunk_keys(k_ptr, keep_ptr, mrun_ptr, rows, row_ok, mi, norm_coef, rate_ptr,
                D: tl.constexpr, HAS_KEEP: tl.constexpr, HAS_RATE: tl.constexpr):
    """The keys of a causal chunk, whose queries are the same rows: (x, off, kept, M_j, T)
    with off the per-key offset g_j - M_j at the key's own running max and T_ij =
    exp2(M_j - M_i) for kept j <= i (i inside the sequence, at scale mi), 0 elsewhere."""
    kept = _kept(keep_ptr, rows, row_ok, HAS_KEEP)
    x = _load_rows(k_ptr, rows, row_ok, D, D)
    mj = tl.load(mrun_ptr + rows, mask=row_ok, other=_NEG)
    off = key_shift(_key_offset(x, rows, norm_coef, rate_ptr, HAS_RATE), mj, kept)
    vis = (rows[None, :] <= rows[:, None]) & kept[None, :] & row_ok[:, None]
    T = tl.where(vis, tl.exp2(mj[None, :] - mi[:, None]), 0.0)
    return x, off, kept, mj, T


@triton.jit
def _query_dpsi(g, gden, bscale, S_ptr, s_ptr, f, fm, cv, dv, H, phik, CAUSAL: tl.constexpr,
                PREC: tl.constexpr):
    """dpsi = bscale (g S^T + gden s) (+ H phik, causal) for one half of the features
    (S_ptr, s_ptr at that half's feature 0): the boundary state, then the chunk's keys."""
    S = tl.load(S_ptr + f[:, None] * dv + cv[None, :], mask=fm[:, None] & (cv < dv)[None, :],
                other=0.0)
    s = tl.load(s_ptr + f, mask=fm, other=0.0)
    dpsi = bscale[:, None] * (tl.dot(g, tl.trans(S), input_precision=PREC)
                              + gden[:, None] * s[None, :])
    if CAUSAL:
        dpsi += tl.dot(H, phik, input_precision=PREC)
    return dpsi


@triton.jit
def _query_da(dpsi_lo, dpsi_hi, psi_lo, psi_hi, KIND: tl.constexpr):
    """d a(q) from dpsi: dpsi psi for exp features (minus the -a half for EXP_PM); TRIG
    (psi = [sin a, cos a]) through d sin = cos, d cos = -sin."""
    if KIND == 2:
        return dpsi_lo * psi_hi - dpsi_hi * psi_lo
    if KIND == 1:
        return dpsi_lo * psi_lo - dpsi_hi * psi_hi
    return dpsi_lo * psi_lo


@triton.jit
def _key_dphi(vk, kscale, R_ptr, r_ptr, f, fm, cv, dv, PREC: tl.constexpr):
    """(dphi, R) for one half of the features: dphi = kscale (v R^T + r)."""
    R = tl.load(R_ptr + f[:, None] * dv + cv[None, :], mask=fm[:, None] & (cv < dv)[None, :],
                other=0.0)
    r = tl.load(r_ptr + f, mask=fm, other=0.0)
    return kscale[:, None] * (tl.dot(vk, tl.trans(R), input_precision=PREC) + r[None, :]), R


@triton.jit
def _key_da(dphi_lo, dphi_hi, e_lo, e_hi, phi_lo, phi_hi, ak, valid, KIND: tl.constexpr):
    """(da, dl) of keys: dl = dphi phi summed over the pair (f, m + f) (the gradient of the
    log-features' shared terms), da through +-a (EXP_PM) or the amplitude (TRIG); zero
    where not valid."""
    dl = dphi_lo * phi_lo
    if KIND == 2:
        da = dphi_lo * e_lo * tl.cos(ak) - dphi_hi * e_hi * tl.sin(ak)
        dl += dphi_hi * phi_hi
    elif KIND == 1:
        dl_hi = dphi_hi * phi_hi
        da = dl - dl_hi
        dl += dl_hi
    else:
        da = dl
    return tl.where(valid, da, 0.0), tl.where(valid, dl, 0.0)
