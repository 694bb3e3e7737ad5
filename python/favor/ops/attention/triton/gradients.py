"""Fused Triton backward of FAVOR attention on the canonical map (../canonical.py,
docs/numerics.md): gradients of y = (psi^T [S | s]) / (psi^T s) w.r.t. q, k, v and the map
parameters (W with sqrt(scale) folded in, bias, key_logw = log lambda^2, rate = -log gamma).

Nothing is saved by the forward except y: every kernel recomputes the log-features it needs
from q, k and W in fp32, with the forward's prologue (features.py, through gradient_tiles.py):
log2 units for the log-features, the maxima M and the shifts c_i, and the key offsets
g_j - M formed in float64 and rounded once. The shifts (key maxima M, query shifts c_i)
cancel in the ratio, so they are constants of the gradient. With den_i = psi_i . s_i and
g_i = dy_i / den_i the gradient w.r.t. the augmented numerator [num_i | den_i] is
G_i = [g_i | -g_i . y_i]; then
dpsi_i = [S_i | s_i] G_i, dphi_j = R_j [v_j | 1] and dv_j = phi_j^T R_j[:, :Dv], where R_j
sums psi_i G_i^T over the queries that see key j (at the key's scale in causal mode).

Kernels (one program per (head, row tile) or (head, feature tile); F is walked in tiles of
BF base features, each tile holding features f and m + f together so that the +-a / sin-cos
pairs meet; D and Dv are one padded block each):
  _key_max_kernel      M: the key maximum per head, and per key the running maximum (causal)
  _key_state_kernel    [S | s] per head (bidirectional) or at every chunk boundary (causal)
  _query_grad_kernel   per query tile: c_i, den_i, G_i (stored), dq
  _feature_sums_kernel per feature tile: R = sum psi_i G_i^T (bidirectional) or its suffix
                       sums per chunk (causal, a reverse scan), and the tile's parameter
                       gradients (dW, dbias, dkey_logw, drate) summed over every row
  _key_grad_kernel     per key tile: dk, dv
The parameter gradients are per-head sums in a fixed row order, reduced over the heads that
share a set by torch (no float atomics): the result is deterministic, and no per-row-tile
partials are stored.

Costs and limits (not measured on a GPU yet): every kernel recomputes the features it needs,
since the query shift c_i, the denominator and the dead-feature rule need the row's key
normaliser (causal: the prefix sum), which no kernel stores. Causal: five exps per key
feature (key state, the two walks of the query tile, the feature tile, the key tile) and
four per query feature; bidirectional: three per key feature (the feature tile walks the
keys again for the parameters) and three per query feature. need_params=False skips the
parameter work. The key maximum walks N serially per head, the state and feature-tile
kernels per (head, feature tile).
"""
import torch
import triton
import triton.language as tl

from .features import key_shift
from .gradient_tiles import (_NEG, EXP, _chunk_keys, _head_map, _key_da, _key_dphi,
                             _key_features, _key_offset, _key_row_max, _key_tile, _kept,
                             _load_rows, _normaliser, _query_da, _query_dpsi, _query_features,
                             _query_shift, _query_tile)

# Every output and scratch buffer is allocated here; tests replace it with a NaN-filling
# allocator so that an element no kernel writes fails the comparison.
_empty = torch.empty


@triton.jit
def _key_max_kernel(k_ptr, keep_ptr, w_ptr, b_ptr, klw_ptr, rate_ptr, mrun_ptr, mtot_ptr,
                    n, m, heads, w_sets, b_sets, l_sets, r_sets, norm_coef,
                    D: tl.constexpr, BT: tl.constexpr, BF: tl.constexpr, KIND: tl.constexpr,
                    HAS_BIAS: tl.constexpr, HAS_KLW: tl.constexpr, HAS_RATE: tl.constexpr,
                    HAS_KEEP: tl.constexpr, CAUSAL: tl.constexpr, PREC: tl.constexpr):
    """Per head: M = max of l_jf over kept keys and all f; causal: the running max per key."""
    bh = tl.program_id(0).to(tl.int64)
    k_ptr += bh * n * D
    keep_ptr += (bh // heads) * n
    w_ptr, b_ptr, klw_ptr, rate_ptr = _head_map(w_ptr, b_ptr, klw_ptr, rate_ptr, bh, m, w_sets,
                                                b_sets, l_sets, r_sets, D)
    carry = tl.max(tl.full([BT], _NEG, tl.float32), 0)
    for t0 in range(0, n, BT):
        j = t0 + tl.arange(0, BT)
        jm = j < n
        kept = _kept(keep_ptr, j, jm, HAS_KEEP)
        x = _load_rows(k_ptr, j, jm, D, D)
        g = _key_offset(x, j, norm_coef, rate_ptr, HAS_RATE)
        rmax = tl.full([BT], _NEG, tl.float32)
        for f0 in range(0, m, BF):
            f = f0 + tl.arange(0, BF)
            a, lo, hi, w = _key_tile(x, w_ptr, b_ptr, klw_ptr, f, m, D, KIND, HAS_BIAS, HAS_KLW,
                                     PREC)
            rmax = tl.maximum(rmax, _key_row_max(lo, hi, g, kept, KIND))
        if CAUSAL:
            # running max inside the tile as a masked [BT, BT] max (no custom-combine scan)
            run = tl.max(tl.where(j[None, :] <= j[:, None], rmax[None, :], _NEG), 1)
            tl.store(mrun_ptr + bh * n + j, tl.maximum(run, carry), mask=jm)
        carry = tl.maximum(carry, tl.max(rmax, 0))
    tl.store(mtot_ptr + bh, carry)


@triton.jit
def _key_state_kernel(k_ptr, v_ptr, keep_ptr, w_ptr, b_ptr, klw_ptr, rate_ptr, mrun_ptr,
                      mtot_ptr, S_ptr, s_ptr, n, m, dv, heads, w_sets, b_sets, l_sets, r_sets,
                      norm_coef, D: tl.constexpr, BT: tl.constexpr, BF: tl.constexpr,
                      BV: tl.constexpr, KIND: tl.constexpr, HAS_BIAS: tl.constexpr,
                      HAS_KLW: tl.constexpr, HAS_RATE: tl.constexpr, HAS_KEEP: tl.constexpr,
                      CAUSAL: tl.constexpr, PREC: tl.constexpr):
    """[S | s] of one feature tile: bidirectional the total at M (slot 0); causal the state
    before every chunk, at the running max of the chunk's previous key (fp32 forward scan)."""
    bh = tl.program_id(0).to(tl.int64)
    f = tl.program_id(1) * BF + tl.arange(0, BF)
    fm = f < m
    ft = m if KIND == 0 else 2 * m
    nslots = tl.cdiv(n, BT) if CAUSAL else 1
    k_ptr += bh * n * D
    v_ptr += bh * n * dv
    keep_ptr += (bh // heads) * n
    w_ptr, b_ptr, klw_ptr, rate_ptr = _head_map(w_ptr, b_ptr, klw_ptr, rate_ptr, bh, m, w_sets,
                                                b_sets, l_sets, r_sets, D)
    mrun_ptr += bh * n
    S_ptr += bh * nslots * ft * dv
    s_ptr += bh * nslots * ft
    cv = tl.arange(0, BV)
    smask = fm[:, None] & (cv < dv)[None, :]
    S_lo = tl.zeros([BF, BV], tl.float32)
    S_hi = tl.zeros([BF, BV], tl.float32)
    s_lo = tl.zeros([BF], tl.float32)
    s_hi = tl.zeros([BF], tl.float32)
    mprev = tl.load(mtot_ptr + bh)
    if CAUSAL:
        mprev = tl.max(tl.full([BT], _NEG, tl.float32), 0)
    for t0 in range(0, n, BT):
        j = t0 + tl.arange(0, BT)
        jm = j < n
        kept = _kept(keep_ptr, j, jm, HAS_KEEP)
        x = _load_rows(k_ptr, j, jm, D, D)
        vv = _load_rows(v_ptr, j, jm, dv, BV)
        g = _key_offset(x, j, norm_coef, rate_ptr, HAS_RATE)
        a, lo, hi, w = _key_tile(x, w_ptr, b_ptr, klw_ptr, f, m, D, KIND, HAS_BIAS, HAS_KLW,
                                 PREC)
        mref = mprev
        if CAUSAL:
            slot = t0 // BT
            tl.store(S_ptr + slot * ft * dv + f[:, None] * dv + cv[None, :], S_lo, mask=smask)
            tl.store(s_ptr + slot * ft + f, s_lo, mask=fm)
            if KIND != 0:
                tl.store(S_ptr + slot * ft * dv + (m + f)[:, None] * dv + cv[None, :], S_hi,
                         mask=smask)
                tl.store(s_ptr + slot * ft + m + f, s_hi, mask=fm)
            mref = tl.load(mrun_ptr + tl.minimum(t0 + BT, n) - 1)
            scale = tl.exp2(mprev - mref)
            S_lo *= scale
            s_lo *= scale
            S_hi *= scale
            s_hi *= scale
            mprev = mref
        e_lo, e_hi, phi_lo, phi_hi = _key_features(lo, hi, a, key_shift(g, mref, kept), kept,
                                                   KIND)
        S_lo += tl.dot(tl.trans(phi_lo), vv, input_precision=PREC)
        s_lo += tl.sum(phi_lo, 0)
        if KIND != 0:
            S_hi += tl.dot(tl.trans(phi_hi), vv, input_precision=PREC)
            s_hi += tl.sum(phi_hi, 0)
    if not CAUSAL:
        tl.store(S_ptr + f[:, None] * dv + cv[None, :], S_lo, mask=smask)
        tl.store(s_ptr + f, s_lo, mask=fm)
        if KIND != 0:
            tl.store(S_ptr + (m + f)[:, None] * dv + cv[None, :], S_hi, mask=smask)
            tl.store(s_ptr + m + f, s_hi, mask=fm)


@triton.jit
def _query_grad_kernel(q_ptr, k_ptr, v_ptr, y_ptr, dy_ptr, keep_ptr, w_ptr, b_ptr, klw_ptr,
                       rate_ptr, mrun_ptr, S_ptr, s_ptr, c_ptr, g_ptr, gd_ptr, dq_ptr, nq, nk,
                       m, dv, heads, w_sets, b_sets, l_sets, r_sets, norm_coef,
                       D: tl.constexpr, BT: tl.constexpr, BF: tl.constexpr, BV: tl.constexpr,
                       KIND: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_KLW: tl.constexpr,
                       HAS_RATE: tl.constexpr, HAS_KEEP: tl.constexpr, CAUSAL: tl.constexpr,
                       PREC: tl.constexpr):
    """One query tile (a chunk when causal): the shift c_i and the denominator (one walk
    over F, both reduce over every feature), G_i (stored for the other kernels), then a
    second walk for dpsi = [S_i | s_i] G_i (boundary state plus, causal, the chunk's keys
    through the masked [C, C] matrix H_ij = T_ij (g_i . v_j + gden_i)), da and dq."""
    bh = tl.program_id(0).to(tl.int64)
    t = tl.program_id(1)
    ft = m if KIND == 0 else 2 * m
    i = t * BT + tl.arange(0, BT)
    im = i < nq
    q_ptr += bh * nq * D
    w_ptr += (bh % w_sets) * m * D
    b_ptr += (bh % b_sets) * m
    xq = _load_rows(q_ptr, i, im, D, D)
    yy = _load_rows(y_ptr + bh * nq * dv, i, im, dv, BV)
    gy = _load_rows(dy_ptr + bh * nq * dv, i, im, dv, BV)
    cv = tl.arange(0, BV)
    if CAUSAL:
        # keys of this chunk are rows i; the state before it is slot t at scale mb
        mrun_ptr += bh * nk
        mi = tl.load(mrun_ptr + i, mask=im, other=_NEG)
        mb = tl.where(t > 0, tl.load(mrun_ptr + tl.maximum(t * BT - 1, 0)), _NEG)
        bscale = tl.exp2(mb - mi)
        slot = bh * tl.cdiv(nk, BT) + t
        xk, offk, kept, mj, T = _chunk_keys(k_ptr + bh * nk * D, keep_ptr + (bh // heads) * nk,
                                            mrun_ptr, i, im, mi, norm_coef,
                                            rate_ptr + bh % r_sets, D, HAS_KEEP, HAS_RATE)
        vk = _load_rows(v_ptr + bh * nk * dv, i, im, dv, BV)
    else:
        bscale = tl.full([BT], 1.0, tl.float32)
        slot = bh
        T = tl.zeros([BT, BT], tl.float32)
        xk = xq
        offk = bscale
        kept = im
    S_ptr += slot * ft * dv
    s_ptr += slot * ft
    klw_ptr += (bh % l_sets) * m
    smask_cols = (cv < dv)[None, :]

    # c_i and den_i in one walk over F, den rescaled whenever the running shift c grows
    # (as an online softmax): the key chunk's exps are computed once for both
    c = tl.zeros([BT], tl.float32)
    if KIND != 2:
        c = tl.full([BT], _NEG, tl.float32)
    den = tl.zeros([BT], tl.float32)
    for f0 in range(0, m, BF):
        f = f0 + tl.arange(0, BF)
        fm = f < m
        aq, lq, w = _query_tile(xq, w_ptr, b_ptr, f, m, D, KIND, HAS_BIAS, PREC)
        phik_lo = T
        phik_hi = T
        if CAUSAL:
            ak, lo, hi, wk = _key_tile(xk, w_ptr, b_ptr, klw_ptr, f, m, D, KIND, HAS_BIAS,
                                       HAS_KLW, PREC)
            _e0, _e1, phik_lo, phik_hi = _key_features(lo, hi, ak, offk, kept, KIND)
        p_lo, p_hi = _normaliser(bscale, s_ptr, f, fm, m, T, phik_lo, phik_hi, KIND, CAUSAL,
                                 PREC)
        if KIND != 2:
            c_new = _query_shift(c, lq, p_lo, p_hi, KIND)
            den *= tl.exp2(c - c_new)
            c = c_new
        psi_lo, psi_hi = _query_features(aq, lq, c, p_lo, p_hi, KIND)
        den += tl.sum(tl.where(fm[None, :], psi_lo * p_lo, 0.0), 1)
        if KIND != 0:
            den += tl.sum(tl.where(fm[None, :], psi_hi * p_hi, 0.0), 1)

    # zero rows (no visible key, trig with den <= 0, overflow) get zero gradient
    ok = im & (den > 0.0) & (den < float("inf"))
    g = tl.where(ok[:, None], gy / tl.where(ok, den, 1.0)[:, None], 0.0)
    gden = -tl.sum(g * yy, 1)
    tl.store(c_ptr + bh * nq + i, c, mask=im)
    tl.store(g_ptr + bh * nq * dv + i[:, None] * dv + cv[None, :], g,
             mask=im[:, None] & smask_cols)
    tl.store(gd_ptr + bh * nq + i, gden, mask=im)
    H = T
    if CAUSAL:
        H = T * (tl.dot(g, tl.trans(vk), input_precision=PREC) + gden[:, None])

    dq = tl.zeros([BT, D], tl.float32)
    for f0 in range(0, m, BF):
        f = f0 + tl.arange(0, BF)
        fm = f < m
        aq, lq, w = _query_tile(xq, w_ptr, b_ptr, f, m, D, KIND, HAS_BIAS, PREC)
        phik_lo = T
        phik_hi = T
        if CAUSAL:
            ak, lo, hi, wk = _key_tile(xk, w_ptr, b_ptr, klw_ptr, f, m, D, KIND, HAS_BIAS,
                                       HAS_KLW, PREC)
            _e0, _e1, phik_lo, phik_hi = _key_features(lo, hi, ak, offk, kept, KIND)
        p_lo, p_hi = _normaliser(bscale, s_ptr, f, fm, m, T, phik_lo, phik_hi, KIND, CAUSAL,
                                 PREC)
        psi_lo, psi_hi = _query_features(aq, lq, c, p_lo, p_hi, KIND)
        dpsi_lo = _query_dpsi(g, gden, bscale, S_ptr, s_ptr, f, fm, cv, dv, H, phik_lo, CAUSAL,
                              PREC)
        dpsi_hi = dpsi_lo
        if KIND != 0:
            dpsi_hi = _query_dpsi(g, gden, bscale, S_ptr + m * dv, s_ptr + m, f, fm, cv, dv, H,
                                  phik_hi, CAUSAL, PREC)
        da = tl.where(im[:, None] & fm[None, :],
                      _query_da(dpsi_lo, dpsi_hi, psi_lo, psi_hi, KIND), 0.0)
        dq += tl.dot(da, w, input_precision=PREC)
    cd = tl.arange(0, D)
    tl.store(dq_ptr + bh * nq * D + i[:, None] * D + cd[None, :],
             dq.to(dq_ptr.dtype.element_ty), mask=im[:, None])


@triton.jit
def _feature_sums_kernel(q_ptr, k_ptr, v_ptr, keep_ptr, w_ptr, b_ptr, klw_ptr, rate_ptr,
                         mrun_ptr, mtot_ptr, S_ptr, s_ptr, c_ptr, g_ptr, gd_ptr, R_ptr, r_ptr,
                         dw_ptr, db_ptr, dl_ptr, dr_ptr, nq, nk, m, dv, heads, w_sets, b_sets,
                         l_sets, r_sets, norm_coef, D: tl.constexpr, BT: tl.constexpr,
                         BF: tl.constexpr, BV: tl.constexpr, KIND: tl.constexpr,
                         HAS_BIAS: tl.constexpr, HAS_KLW: tl.constexpr, HAS_RATE: tl.constexpr,
                         HAS_KEEP: tl.constexpr, CAUSAL: tl.constexpr,
                         NEED_PARAMS: tl.constexpr, PREC: tl.constexpr):
    """One feature tile of one head, walking the rows in a fixed order: R = sum_i psi_i G_i^T
    and the parameter gradients of the tile (per head: summed here, so no per-row-tile
    partials). Bidirectional: the queries (R, query-side da), then the keys with the full R
    (key-side da, dl). Causal: a reverse scan over chunks; before folding chunk c in, R holds
    the sum over later chunks at the scale of c's last key, R_c = sum_{i >= end of c}
    exp(Me_c - M_i) psi_i G_i^T, which is stored for _key_grad_kernel and used for the
    gradient of c's keys here (with c's own queries through H^T psi)."""
    bh = tl.program_id(0).to(tl.int64)
    f = tl.program_id(1) * BF + tl.arange(0, BF)
    fm = f < m
    ft = m if KIND == 0 else 2 * m
    nt = tl.cdiv(nq, BT)
    nslots = nt if CAUSAL else 1
    q_ptr += bh * nq * D
    k_ptr += bh * nk * D
    v_ptr += bh * nk * dv
    keep_ptr += (bh // heads) * nk
    w_ptr, b_ptr, klw_ptr, rate_ptr = _head_map(w_ptr, b_ptr, klw_ptr, rate_ptr, bh, m, w_sets,
                                                b_sets, l_sets, r_sets, D)
    mrun_ptr += bh * nk
    R_ptr += bh * nslots * ft * dv
    r_ptr += bh * nslots * ft
    S_ptr += bh * nslots * ft * dv
    s_ptr += bh * nslots * ft
    cv = tl.arange(0, BV)
    rmask = fm[:, None] & (cv < dv)[None, :]
    R_lo = tl.zeros([BF, BV], tl.float32)
    R_hi = tl.zeros([BF, BV], tl.float32)
    r_lo = tl.zeros([BF], tl.float32)
    r_hi = tl.zeros([BF], tl.float32)
    dW = tl.zeros([BF, D], tl.float32)
    db = tl.zeros([BF], tl.float32)
    dlw = tl.zeros([BF], tl.float32)
    drate = tl.sum(tl.zeros([BT], tl.float32), 0)
    for tt in range(0, nt):
        t = nt - 1 - tt if CAUSAL else tt
        i = t * BT + tl.arange(0, BT)
        im = i < nq
        xq = _load_rows(q_ptr, i, im, D, D)
        c = tl.load(c_ptr + bh * nq + i, mask=im, other=0.0)
        g = _load_rows(g_ptr + bh * nq * dv, i, im, dv, BV)
        gden = tl.load(gd_ptr + bh * nq + i, mask=im, other=0.0)
        aq, lq, w = _query_tile(xq, w_ptr, b_ptr, f, m, D, KIND, HAS_BIAS, PREC)
        bscale = tl.full([BT], 1.0, tl.float32)
        T = tl.zeros([BT, BT], tl.float32)
        phik_lo = tl.zeros([BT, BF], tl.float32)
        phik_hi = phik_lo
        H = T
        sslot = 0
        if CAUSAL:
            sslot = t
            tl.store(R_ptr + t * ft * dv + f[:, None] * dv + cv[None, :], R_lo, mask=rmask)
            tl.store(r_ptr + t * ft + f, r_lo, mask=fm)
            if KIND != 0:
                tl.store(R_ptr + t * ft * dv + (m + f)[:, None] * dv + cv[None, :], R_hi,
                         mask=rmask)
                tl.store(r_ptr + t * ft + m + f, r_hi, mask=fm)
            me = tl.load(mrun_ptr + tl.minimum(t * BT + BT, nq) - 1)
            mb = tl.where(t > 0, tl.load(mrun_ptr + tl.maximum(t * BT - 1, 0)), _NEG)
            mi = tl.load(mrun_ptr + i, mask=im, other=_NEG)
            bscale = tl.exp2(mb - mi)
            xk, offk, kept, mj, T = _chunk_keys(k_ptr, keep_ptr, mrun_ptr, i, im, mi, norm_coef,
                                                rate_ptr, D, HAS_KEEP, HAS_RATE)
            ak, lo, hi, wk = _key_tile(xk, w_ptr, b_ptr, klw_ptr, f, m, D, KIND, HAS_BIAS,
                                       HAS_KLW, PREC)
            valid = kept[:, None] & fm[None, :]
            e_lo, e_hi, phik_lo, phik_hi = _key_features(lo, hi, ak, offk, kept, KIND)
            if NEED_PARAMS:
                vk = _load_rows(v_ptr, i, im, dv, BV)
                H = T * (tl.dot(g, tl.trans(vk), input_precision=PREC) + gden[:, None])
        p_lo = phik_lo
        p_hi = phik_hi
        if KIND != 2:
            p_lo, p_hi = _normaliser(bscale, s_ptr + sslot * ft, f, fm, m, T, phik_lo, phik_hi,
                                     KIND, CAUSAL, PREC)
        psi_lo, psi_hi = _query_features(aq, lq, c, p_lo, p_hi, KIND)
        psi_lo = tl.where(im[:, None] & fm[None, :], psi_lo, 0.0)
        psi_hi = tl.where(im[:, None] & fm[None, :], psi_hi, 0.0)
        if NEED_PARAMS:
            dpsi_lo = _query_dpsi(g, gden, bscale, S_ptr + sslot * ft * dv, s_ptr + sslot * ft,
                                  f, fm, cv, dv, H, phik_lo, CAUSAL, PREC)
            dpsi_hi = dpsi_lo
            if KIND != 0:
                dpsi_hi = _query_dpsi(g, gden, bscale, S_ptr + sslot * ft * dv + m * dv,
                                      s_ptr + sslot * ft + m, f, fm, cv, dv, H, phik_hi,
                                      CAUSAL, PREC)
            da = tl.where(im[:, None] & fm[None, :],
                          _query_da(dpsi_lo, dpsi_hi, psi_lo, psi_hi, KIND), 0.0)
            dW += tl.dot(tl.trans(da), xq, input_precision=PREC)
            db += tl.sum(da, 0)
            if CAUSAL:  # the keys of chunk t: R (still R_t here) and the chunk's queries
                kscale = tl.where(kept, tl.exp2(mj - me), 0.0)
                dphi_lo = kscale[:, None] * (tl.dot(vk, tl.trans(R_lo), input_precision=PREC)
                                             + r_lo[None, :])
                dphi_lo += tl.dot(tl.trans(H), psi_lo, input_precision=PREC)
                dphi_hi = dphi_lo
                if KIND != 0:
                    dphi_hi = kscale[:, None] * (tl.dot(vk, tl.trans(R_hi), input_precision=PREC)
                                                 + r_hi[None, :])
                    dphi_hi += tl.dot(tl.trans(H), psi_hi, input_precision=PREC)
                da, dl = _key_da(dphi_lo, dphi_hi, e_lo, e_hi, phik_lo, phik_hi, ak, valid, KIND)
                dW += tl.dot(tl.trans(da), xk, input_precision=PREC)
                db += tl.sum(da, 0)
                dlw += tl.sum(dl, 0)
                drate += tl.sum(i.to(tl.float32) * tl.sum(dl, 1), 0)
        rows = tl.where(im, bscale, 0.0)
        if CAUSAL:
            scale = tl.exp2(mb - me)
            R_lo *= scale
            r_lo *= scale
            R_hi *= scale
            r_hi *= scale
        R_lo += tl.dot(tl.trans(psi_lo * rows[:, None]), g, input_precision=PREC)
        r_lo += tl.sum(psi_lo * (rows * gden)[:, None], 0)
        if KIND != 0:
            R_hi += tl.dot(tl.trans(psi_hi * rows[:, None]), g, input_precision=PREC)
            r_hi += tl.sum(psi_hi * (rows * gden)[:, None], 0)
    if not CAUSAL:
        tl.store(R_ptr + f[:, None] * dv + cv[None, :], R_lo, mask=rmask)
        tl.store(r_ptr + f, r_lo, mask=fm)
        if KIND != 0:
            tl.store(R_ptr + (m + f)[:, None] * dv + cv[None, :], R_hi, mask=rmask)
            tl.store(r_ptr + m + f, r_hi, mask=fm)
        if NEED_PARAMS:  # the keys, with the full R
            mtot = tl.load(mtot_ptr + bh)
            for t0 in range(0, nk, BT):
                j = t0 + tl.arange(0, BT)
                jm = j < nk
                kept = _kept(keep_ptr, j, jm, HAS_KEEP)
                xk = _load_rows(k_ptr, j, jm, D, D)
                vk = _load_rows(v_ptr, j, jm, dv, BV)
                offk = key_shift(_key_offset(xk, j, norm_coef, rate_ptr, HAS_RATE), mtot, kept)
                ak, lo, hi, wk = _key_tile(xk, w_ptr, b_ptr, klw_ptr, f, m, D, KIND, HAS_BIAS,
                                           HAS_KLW, PREC)
                valid = kept[:, None] & fm[None, :]
                e_lo, e_hi, phi_lo, phi_hi = _key_features(lo, hi, ak, offk, kept, KIND)
                dphi_lo = tl.dot(vk, tl.trans(R_lo), input_precision=PREC) + r_lo[None, :]
                dphi_hi = dphi_lo
                if KIND != 0:
                    dphi_hi = tl.dot(vk, tl.trans(R_hi), input_precision=PREC) + r_hi[None, :]
                da, dl = _key_da(dphi_lo, dphi_hi, e_lo, e_hi, phi_lo, phi_hi, ak, valid, KIND)
                dW += tl.dot(tl.trans(da), xk, input_precision=PREC)
                db += tl.sum(da, 0)
                dlw += tl.sum(dl, 0)
                drate += tl.sum(j.to(tl.float32) * tl.sum(dl, 1), 0)
    if NEED_PARAMS:
        tl.store(dw_ptr + bh * m * D + f[:, None] * D + tl.arange(0, D)[None, :], dW,
                 mask=fm[:, None])
        if HAS_BIAS:
            tl.store(db_ptr + bh * m + f, db, mask=fm)
        if HAS_KLW:
            tl.store(dl_ptr + bh * m + f, dlw, mask=fm)
        if HAS_RATE:
            tl.store(dr_ptr + bh * tl.num_programs(1) + tl.program_id(1), drate)


@triton.jit
def _key_grad_kernel(q_ptr, k_ptr, v_ptr, keep_ptr, w_ptr, b_ptr, klw_ptr, rate_ptr, mrun_ptr,
                     mtot_ptr, s_ptr, c_ptr, g_ptr, gd_ptr, R_ptr, r_ptr, dk_ptr, dv_ptr, nk, m,
                     dv, heads, w_sets, b_sets, l_sets, r_sets, norm_coef, D: tl.constexpr,
                     BT: tl.constexpr, BF: tl.constexpr, BV: tl.constexpr, KIND: tl.constexpr,
                     HAS_BIAS: tl.constexpr, HAS_KLW: tl.constexpr, HAS_RATE: tl.constexpr,
                     HAS_KEEP: tl.constexpr, CAUSAL: tl.constexpr, PREC: tl.constexpr):
    """One key tile (a chunk when causal): dphi_j = R [v_j | 1] (rescaled by exp(M_j - Me)
    when causal, plus the chunk's own queries through H^T psi), dv_j = phi_j^T R_S (plus
    sum_i T_ij (psi_i . phi_j) g_i), then dl = dphi phi, da and dk (whose |k|^2 term needs
    dl summed over every feature)."""
    bh = tl.program_id(0).to(tl.int64)
    t = tl.program_id(1)
    ft = m if KIND == 0 else 2 * m
    j = t * BT + tl.arange(0, BT)
    jm = j < nk
    w_ptr, b_ptr, klw_ptr, rate_ptr = _head_map(w_ptr, b_ptr, klw_ptr, rate_ptr, bh, m, w_sets,
                                                b_sets, l_sets, r_sets, D)
    mrun_ptr += bh * nk
    vk = _load_rows(v_ptr + bh * nk * dv, j, jm, dv, BV)
    cv = tl.arange(0, BV)
    if CAUSAL:
        slot = bh * tl.cdiv(nk, BT) + t
        mi = tl.load(mrun_ptr + j, mask=jm, other=_NEG)  # queries of the chunk are rows j
        mb = tl.where(t > 0, tl.load(mrun_ptr + tl.maximum(t * BT - 1, 0)), _NEG)
        me = tl.load(mrun_ptr + tl.minimum(t * BT + BT, nk) - 1)
        bscale = tl.exp2(mb - mi)
        xk, offk, kept, mj, T = _chunk_keys(k_ptr + bh * nk * D, keep_ptr + (bh // heads) * nk,
                                            mrun_ptr, j, jm, mi, norm_coef, rate_ptr, D,
                                            HAS_KEEP, HAS_RATE)
        kscale = tl.where(kept, tl.exp2(mj - me), 0.0)
        xq = _load_rows(q_ptr + bh * nk * D, j, jm, D, D)
        c = tl.load(c_ptr + bh * nk + j, mask=jm, other=0.0)
        g = _load_rows(g_ptr + bh * nk * dv, j, jm, dv, BV)
        gden = tl.load(gd_ptr + bh * nk + j, mask=jm, other=0.0)
        H = T * (tl.dot(g, tl.trans(vk), input_precision=PREC) + gden[:, None])
    else:
        slot = bh
        kept = _kept(keep_ptr + (bh // heads) * nk, j, jm, HAS_KEEP)
        xk = _load_rows(k_ptr + bh * nk * D, j, jm, D, D)
        offk = key_shift(_key_offset(xk, j, norm_coef, rate_ptr, HAS_RATE),
                         tl.load(mtot_ptr + bh), kept)
        kscale = tl.where(kept, 1.0, 0.0)
        T = tl.zeros([BT, BT], tl.float32)
        bscale = kscale
        xq = xk
        c = kscale
        g = vk
        H = T
    R_ptr += slot * ft * dv
    r_ptr += slot * ft
    pqk = tl.zeros([BT, BT], tl.float32)
    dk = tl.zeros([BT, D], tl.float32)
    dvk = tl.zeros([BT, BV], tl.float32)
    dg = tl.zeros([BT], tl.float32)
    for f0 in range(0, m, BF):
        f = f0 + tl.arange(0, BF)
        fm = f < m
        ak, lo, hi, w = _key_tile(xk, w_ptr, b_ptr, klw_ptr, f, m, D, KIND, HAS_BIAS, HAS_KLW,
                                  PREC)
        valid = kept[:, None] & fm[None, :]
        e_lo, e_hi, phi_lo, phi_hi = _key_features(lo, hi, ak, offk, kept, KIND)
        dphi_lo, R_lo = _key_dphi(vk, kscale, R_ptr, r_ptr, f, fm, cv, dv, PREC)
        dvk += kscale[:, None] * tl.dot(phi_lo, R_lo, input_precision=PREC)
        dphi_hi = dphi_lo
        if KIND != 0:
            dphi_hi, R_hi = _key_dphi(vk, kscale, R_ptr + m * dv, r_ptr + m, f, fm, cv, dv, PREC)
            dvk += kscale[:, None] * tl.dot(phi_hi, R_hi, input_precision=PREC)
        if CAUSAL:
            aq, lq, wq = _query_tile(xq, w_ptr, b_ptr, f, m, D, KIND, HAS_BIAS, PREC)
            p_lo = phi_lo
            p_hi = phi_hi
            if KIND != 2:
                p_lo, p_hi = _normaliser(bscale, s_ptr + slot * ft, f, fm, m, T, phi_lo, phi_hi,
                                         KIND, CAUSAL, PREC)
            psi_lo, psi_hi = _query_features(aq, lq, c, p_lo, p_hi, KIND)
            psi_lo = tl.where(jm[:, None] & fm[None, :], psi_lo, 0.0)
            dphi_lo += tl.dot(tl.trans(H), psi_lo, input_precision=PREC)
            pqk += tl.dot(psi_lo, tl.trans(phi_lo), input_precision=PREC)
            if KIND != 0:
                psi_hi = tl.where(jm[:, None] & fm[None, :], psi_hi, 0.0)
                dphi_hi += tl.dot(tl.trans(H), psi_hi, input_precision=PREC)
                pqk += tl.dot(psi_hi, tl.trans(phi_hi), input_precision=PREC)
        da, dl = _key_da(dphi_lo, dphi_hi, e_lo, e_hi, phi_lo, phi_hi, ak, valid, KIND)
        dg += tl.sum(dl, 1)
        dk += tl.dot(da, w, input_precision=PREC)
    if CAUSAL:
        dvk += tl.dot(tl.trans(T * pqk), g, input_precision=PREC)
    dk += (2.0 * norm_coef) * dg[:, None] * xk
    dk = tl.where(kept[:, None], dk, 0.0)
    dvk = tl.where(kept[:, None], dvk, 0.0)
    cd = tl.arange(0, D)
    tl.store(dk_ptr + bh * nk * D + j[:, None] * D + cd[None, :], dk.to(dk_ptr.dtype.element_ty),
             mask=jm[:, None])
    tl.store(dv_ptr + bh * nk * dv + j[:, None] * dv + cv[None, :],
             dvk.to(dv_ptr.dtype.element_ty), mask=jm[:, None] & (cv < dv)[None, :])


def _sets_sum(per_head, sets, heads):
    """Per-head gradients [BH, ...] summed over the heads sharing a set (head bh uses set
    bh % sets; sets is 1, H or B*H), in a fixed order: [sets, ...]."""
    if sets == per_head.shape[0]:
        return per_head
    if sets == 1:
        return per_head.sum(0, keepdim=True)
    return per_head.reshape(-1, heads, *per_head.shape[1:]).sum(0)


def _tiles(d, bv, m, chunk):
    """(rows per program, base features per tile) that fit sm_90's 227 KB of shared memory
    at num_stages=1. Sizes read from triton.compile for sm_90 (no GPU run): _key_grad_kernel
    is the largest, 213 KB at D = Dv = 64 with 64 x 64 tiles, 262 KB at D = 128 (so 32
    features there), 106 KB at D = Dv = 128 with 32 x 32."""
    if d <= 64 and bv <= 64:
        bt, bf = 64, 64
    elif d + bv <= 192:
        bt, bf = 64, 32
    elif bv <= 128:
        bt, bf = 32, 32
    else:
        bt, bf = 32, 16
    return min(chunk, bt), min(bf, max(16, triton.next_power_of_2(m)))


def backward(dy, q, k, v, y, W, bias, key_logw, rate, norm_coef, kind, causal, keep, heads, *,
             chunk=64, precision="tf32", need_params=True, block_m=None):
    """Gradients of FAVOR attention on the canonical map (same arguments as the forward).

    dy, y [BH, Nq, Dv]; q [BH, Nq, D]; k [BH, Nk, D]; v [BH, Nk, Dv] (fp32 / fp16 / bf16,
    computed in fp32); W [w_sets, m, D] (sqrt(scale) folded in), bias [b_sets, m],
    key_logw [l_sets, m], rate [r_sets] (causal decay) fp32 or None; norm_coef a float; kind
    0 EXP, 1 EXP_PM, 2 TRIG; keep [B, Nk] (nonzero = attend) or None; heads = H (BH = B H).
    chunk: at most this many rows per program (a power of two >= 16; fewer where the tiles
    would not fit in shared memory: _tiles; the math is the same for any chunk); block_m:
    base features per tile (a power of two >= 16; default from _tiles); precision: tl.dot's
    input_precision ("tf32" on the GPU, "ieee" for exact fp32). D in {16, 32, 64, 128}, any
    Dv <= 256, any m, N.
    Returns (dq, dk, dv, dW, dbias, dkey_logw, drate): dq/dk/dv in the inputs' shapes and
    dtypes; the parameter gradients fp32 in the parameters' shapes, None where the parameter
    is None or need_params is False. Rows whose denominator is not > 0 (or not finite) and
    masked keys get zero gradient. Deterministic (fixed-order sums, no atomics)."""
    bh, nq, d = q.shape
    nk, dv = k.shape[1], v.shape[2]
    w_sets, m, _ = W.shape
    if d not in (16, 32, 64, 128):
        raise ValueError(f"q: head dim {d}; must be 16, 32, 64 or 128")
    if chunk < 16 or chunk & (chunk - 1):
        raise ValueError(f"chunk: {chunk}; must be a power of two >= 16")
    if causal and nq != nk:
        raise ValueError(f"causal: Nq ({nq}) must equal Nk ({nk})")
    if bh % heads:
        raise ValueError(f"heads: {heads} does not divide B*H ({bh})")
    if keep is not None and tuple(keep.shape) != (bh // heads, nk):
        raise ValueError(f"keep: shape {tuple(keep.shape)}; must be [B, Nk] = "
                         f"[{bh // heads}, {nk}]")
    if block_m is not None and (block_m < 16 or block_m & (block_m - 1)):
        raise ValueError(f"block_m: {block_m}; must be a power of two >= 16")
    if dv > 256:
        raise ValueError(f"v: value dim {dv}; must be at most 256")
    bv = max(16, triton.next_power_of_2(dv))
    chunk, bf = _tiles(d, bv, m, chunk)
    bf = block_m or bf
    ft = m if kind == EXP else 2 * m
    dev = q.device
    f32 = torch.float32
    q, k, v, y, dy = (t.contiguous() for t in (q, k, v, y, dy))
    W = W.to(f32).contiguous()
    dummy = W
    has = [t is not None for t in (bias, key_logw, rate, keep)]
    bias_, klw_, rate_ = (W if t is None else t.to(f32).contiguous()
                          for t in (bias, key_logw, rate))
    keep_ = dummy if keep is None else (keep != 0).to(torch.int8).contiguous()
    sets = (w_sets, *(t.shape[0] if t is not None else 1 for t in (bias, key_logw, rate)))
    nt_q, nt_k = triton.cdiv(nq, chunk), triton.cdiv(nk, chunk)
    nslots = nt_k if causal else 1
    mrun = _empty(bh, nk, dtype=f32, device=dev)
    mtot = _empty(bh, dtype=f32, device=dev)
    S = _empty(bh, nslots, ft, dv, dtype=f32, device=dev)
    s = _empty(bh, nslots, ft, dtype=f32, device=dev)
    R = _empty(bh, nslots, ft, dv, dtype=f32, device=dev)
    r = _empty(bh, nslots, ft, dtype=f32, device=dev)
    c = _empty(bh, nq, dtype=f32, device=dev)
    g = _empty(bh, nq, dv, dtype=f32, device=dev)
    gd = _empty(bh, nq, dtype=f32, device=dev)
    dq = _empty(q.shape, dtype=q.dtype, device=dev)
    dk = _empty(k.shape, dtype=k.dtype, device=dev)
    dv_ = _empty(v.shape, dtype=v.dtype, device=dev)
    mt = triton.cdiv(m, bf)
    if need_params:  # per head; drate per head and feature tile
        dwh = _empty(bh, m, d, dtype=f32, device=dev)
        dbh = _empty(bh, m, dtype=f32, device=dev) if has[0] else dummy
        dlh = _empty(bh, m, dtype=f32, device=dev) if has[1] else dummy
        drh = _empty(bh, mt, dtype=f32, device=dev) if has[2] else dummy
    else:
        dwh = dbh = dlh = drh = dummy
    flags = dict(KIND=kind, HAS_BIAS=has[0], HAS_KLW=has[1], HAS_RATE=has[2],
                 HAS_KEEP=has[3], CAUSAL=bool(causal), PREC=precision,
                 num_stages=1)  # pipelining buffers would not fit next to the tiles
    common = (heads, *sets, float(norm_coef))
    tiles = dict(D=d, BT=chunk, BF=bf)
    _key_max_kernel[(bh,)](k, keep_, W, bias_, klw_, rate_, mrun, mtot, nk, m, *common,
                           **tiles, **flags)
    _key_state_kernel[(bh, mt)](k, v, keep_, W, bias_, klw_, rate_, mrun, mtot, S, s, nk, m,
                                dv, *common, **tiles, BV=bv, **flags)
    _query_grad_kernel[(bh, nt_q)](q, k, v, y, dy, keep_, W, bias_, klw_, rate_, mrun, S, s,
                                   c, g, gd, dq, nq, nk, m, dv, *common, **tiles, BV=bv,
                                   **flags)
    _feature_sums_kernel[(bh, mt)](q, k, v, keep_, W, bias_, klw_, rate_, mrun, mtot, S, s, c,
                                   g, gd, R, r, dwh, dbh, dlh, drh, nq, nk, m, dv, *common,
                                   **tiles, BV=bv, NEED_PARAMS=need_params, **flags)
    _key_grad_kernel[(bh, nt_k)](q, k, v, keep_, W, bias_, klw_, rate_, mrun, mtot, s, c, g, gd,
                                 R, r, dk, dv_, nk, m, dv, *common, **tiles, BV=bv, **flags)
    if not need_params:
        return dq, dk, dv_, None, None, None, None
    dW = _sets_sum(dwh, w_sets, heads)
    db = _sets_sum(dbh, sets[1], heads) if has[0] else None
    dl = _sets_sum(dlh, sets[2], heads) if has[1] else None
    dr = _sets_sum(drh.sum(1, keepdim=True), sets[3], heads).reshape(-1) if has[2] else None
    return dq, dk, dv_, dW, db, dl, dr
