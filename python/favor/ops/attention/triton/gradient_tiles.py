"""The tile helpers of the fused backward (gradients.py): loads, the projection, the key log
weight and log-features, the features of a tile (f and m + f together), the query features
after the shift, and the pieces of the chain rule through the features (dpsi, da, dphi).
@triton.jit functions inlined into gradients.py's kernels."""
import triton
import triton.language as tl

_LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x log2 e): the hardware has exp2
_NEG = tl.constexpr(-1.0e30)  # "no key yet": finite, so NEG - NEG = 0, never NaN
_FLT_MIN = tl.constexpr(1.1754944e-38)  # key sums below this are dead features

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
def _project(x, w_ptr, b_ptr, f, fm, D: tl.constexpr, HAS_BIAS: tl.constexpr,
             PREC: tl.constexpr):
    """a = x W[f]^T + bias[f] for a tile of base features f; also the W rows (zero past m)."""
    w = tl.load(w_ptr + f[:, None] * D + tl.arange(0, D)[None, :], mask=fm[:, None], other=0.0)
    a = tl.dot(x, tl.trans(w), input_precision=PREC)
    if HAS_BIAS:
        a += tl.load(b_ptr + f, mask=fm, other=0.0)[None, :]
    return a, w


@triton.jit
def _key_offset(x, rows, norm_coef, rate_ptr, HAS_RATE: tl.constexpr):
    """g_j = norm_coef |k_j|^2 + j rate: the part of key j's log-features shared by all f."""
    g = norm_coef * tl.sum(x * x, 1)
    if HAS_RATE:
        g += rows.to(tl.float32) * tl.load(rate_ptr)
    return g


@triton.jit
def _key_logits(a, g, klw_ptr, f, fm, HAS_KLW: tl.constexpr, KIND: tl.constexpr):
    """Key log-features of features f (lo) and m + f (hi; equal to lo for TRIG, unused for EXP)."""
    base = g[:, None] + tl.zeros_like(a)
    if HAS_KLW:
        base += tl.load(klw_ptr + f, mask=fm, other=0.0)[None, :]
    if KIND == 2:
        return base, base
    return base + a, base - a


@triton.jit
def _key_features(lo, hi, a, mref, valid, KIND: tl.constexpr):
    """(e_lo, e_hi, phi_lo, phi_hi): e = exp(l - mref) (0 where not valid), phi = amp e."""
    e_lo = tl.where(valid, tl.exp2((lo - mref) * _LOG2E), 0.0)
    if KIND == 0:
        e_hi = e_lo
    else:
        e_hi = tl.where(valid, tl.exp2((hi - mref) * _LOG2E), 0.0)
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
def _query_features(a, c, p_lo, p_hi, fm, KIND: tl.constexpr):
    """psi for features f and m + f: exp(+-a - c) where the feature is live (its key sum
    p >= FLT_MIN), 0 where dead; TRIG [sin a, cos a]."""
    if KIND == 2:
        return tl.sin(a), tl.cos(a)
    lo = tl.where((p_lo >= _FLT_MIN) & fm[None, :], tl.exp2((a - c[:, None]) * _LOG2E), 0.0)
    hi = lo
    if KIND == 1:
        hi = tl.where((p_hi >= _FLT_MIN) & fm[None, :], tl.exp2((-a - c[:, None]) * _LOG2E), 0.0)
    return lo, hi


@triton.jit
def _chunk_keys(k_ptr, keep_ptr, mrun_ptr, rows, row_ok, mi, norm_coef, rate_ptr,
                D: tl.constexpr, HAS_KEEP: tl.constexpr, HAS_RATE: tl.constexpr):
    """The keys of a causal chunk, whose queries are the same rows: (x, g, kept, M_j, T)
    with T_ij = exp(M_j - M_i) for kept j <= i (i inside the sequence, at scale mi), 0
    elsewhere."""
    kept = _kept(keep_ptr, rows, row_ok, HAS_KEEP)
    x = _load_rows(k_ptr, rows, row_ok, D, D)
    g = _key_offset(x, rows, norm_coef, rate_ptr, HAS_RATE)
    mj = tl.load(mrun_ptr + rows, mask=row_ok, other=_NEG)
    vis = (rows[None, :] <= rows[:, None]) & kept[None, :] & row_ok[:, None]
    T = tl.where(vis, tl.exp2((mj[None, :] - mi[:, None]) * _LOG2E), 0.0)
    return x, g, kept, mj, T


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
