"""Fused FAVOR attention forward in Triton: the canonical map (features.py) computed on tiles,
features never stored, all statistics in fp32 (docs/numerics.md for the stabilisation).

Bidirectional (three launches):
  _key_partials  grid (key splits, BH, F x Dv tiles): each split walks its key tiles with a
                 running max (split-K: a few splits fill the GPU, so the partials take
                 O(splits F Dv) memory per head whatever N is);
  _combine       grid (BH, F tiles, Dv tiles): M = max_p M_p, [S | s] = sum_p exp(M_p - M)
                 [S_p | s_p] in the fixed order p = 0, 1, ... (deterministic);
  _bidir_queries grid (query tiles, BH, Dv tiles): the shift c_i, dead features, the ratio.
Causal, Nq = Nk, chunks of C keys (three launches):
  _key_partials  (the same kernel) chunk-local [S | s] at the chunk's max, and each key's
                 max over the feature tile (for the running max M_j);
  _scan          grid (BH, F tiles, Dv tiles): sequential over chunks, the boundary states
                 (prefix before each chunk, and the total) at the running max B_c;
  _causal_out    grid (chunks, BH, Dv tiles): A_ij = psi_i.phi_j exp(M_j - M_i) (j <= i) on
                 tl.dot, the inter-chunk term exp(B_c - M_i) psi_i H_c, and the prefix
                 normaliser P_i (a masked dot) for the shift c_i.
All maxima and shifts are kept in log2 units (M2 = M log2 e).
Cost notes (written for sm_90, not measured: no GPU here): the causal output pass walks the
feature tiles twice for the EXP kinds, since c_i needs the max over every feature of
a(q_i) + log P_i before any psi, so it forms each key feature twice (2 exp2 per key and
feature, plus C per row for exp2(M_j - M_i) and one per query feature); the bidirectional
query pass forms psi once. Partial and boundary states are fp32: causal O(N / C F Dv) per
head (as fla's chunk states), bidirectional O(splits F Dv).
"""
import torch
import triton
import triton.language as tl

from . import params as P
from .features import (amplitude, feature_tile, key_features, key_log2, key_max, key_offset,
                       key_shift, project, query_features, query_log2, shift_terms)

# Launch choices for sm_90 at D = 64, F = 256, C = 64, Dv = 64 (ptxas -v on the bundled
# ptxas, bf16 inputs; not timed, no GPU here): with 4 warps _key_partials, _bidir_queries and
# _causal_out spill (116, 412, 2052 bytes); with 8 warps only _causal_out does (964 bytes at
# 64 features per tile, 272 at 32, none at 16), so _causal_out walks F in tiles of 16.
# On the device the autotuner picks num_warps / num_stages (P.tuned); NUM_WARPS is the
# spill-free choice that the compile check lowers.
NUM_WARPS = 8
CAUSAL_BLOCK_F = 16


@P.tuned(["D", "F", "DV", "TPP"])
@triton.jit
def _key_partials(k_ptr, v_ptr, w_ptr, b_ptr, lw_ptr, r_ptr, keep_ptr,
                  ps_ptr, pz_ptr, pm_ptr, rm_ptr,
                  N, D, DV, F, m, H, W_SETS, B_SETS, L_SETS, R_SETS, norm_coef, TPP, N_DV,
                  KIND: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_LOGW: tl.constexpr,
                  HAS_RATE: tl.constexpr, HAS_KEEP: tl.constexpr, STORE_ROWMAX: tl.constexpr,
                  PRECISION: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_F: tl.constexpr,
                  BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Key tiles p TPP .. (p + 1) TPP - 1 of head bh, feature tile fb, value tile dvb (axis 2
    = fb N_DV + dvb): [S_p | s_p] (ps [BH, P, F, DV], pz [BH, P, F]) at the running max M_p
    over their kept keys and the tile's features (pm [BH, P, nF]; -inf when no key is kept),
    rescaled by exp2(M_old - M_new) as it grows; W's tile is loaded once. With STORE_ROWMAX
    (causal, TPP = 1: one chunk) each key's max over the tile's features (rm [BH, nF, N])."""
    p = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    fb = tl.program_id(2) // N_DV
    dvb = tl.program_id(2) % N_DV
    n_p = tl.num_programs(0)
    n_f = tl.num_programs(2) // N_DV
    f0 = fb * BLOCK_F
    f = f0 + tl.arange(0, BLOCK_F)
    w, bias, lw, sign, fok = feature_tile(w_ptr + (bh % W_SETS) * m * D, b_ptr + (bh % B_SETS) * m,
                                          lw_ptr + (bh % L_SETS) * m, f, m, F, D,
                                          KIND, HAS_BIAS, HAS_LOGW, BLOCK_D)
    rate = 0.0
    if HAS_RATE:
        rate = tl.load(r_ptr + bh % R_SETS)
    d = tl.arange(0, BLOCK_D)
    e = dvb * BLOCK_DV + tl.arange(0, BLOCK_DV)
    mx = tl.full([], float("-inf"), tl.float32)
    acc = tl.zeros([BLOCK_F, BLOCK_DV], dtype=tl.float32)
    accz = tl.zeros([BLOCK_F], dtype=tl.float32)
    for t in range(p * TPP, tl.minimum(p * TPP + TPP, tl.cdiv(N, BLOCK_N))):
        rows = t * BLOCK_N + tl.arange(0, BLOCK_N)
        inside = rows < N
        ok = inside
        if HAS_KEEP:
            ok = ok & (tl.load(keep_ptr + (bh // H) * N + rows, mask=inside, other=0) != 0)
        x = tl.load(k_ptr + bh * N * D + rows[:, None] * D + d[None, :],
                    mask=inside[:, None] & (d[None, :] < D), other=0.0).to(tl.float32)
        a = project(x, w, bias, PRECISION)
        lk = key_log2(a, sign, lw, KIND)
        g = key_offset(x, rows, norm_coef, rate, HAS_RATE)
        kmax = key_max(lk, g, ok)
        if STORE_ROWMAX:
            if dvb == 0:
                tl.store(rm_ptr + (bh * n_f + fb) * N + rows, kmax, mask=inside)
        mn = tl.maximum(mx, tl.max(kmax, 0))
        r = tl.where(mx == float("-inf"), 0.0, tl.exp2(mx - mn))
        phi = key_features(lk, key_shift(g, mn, ok), ok, a, f, m, KIND)
        v = tl.load(v_ptr + bh * N * DV + rows[:, None] * DV + e[None, :],
                    mask=inside[:, None] & (e[None, :] < DV), other=0.0).to(tl.float32)
        acc = acc * r + tl.dot(tl.trans(phi), v, input_precision=PRECISION)
        accz = accz * r + tl.sum(phi, 0)
        mx = mn
    base = bh * n_p + p
    tl.store(ps_ptr + (base * F + f[:, None]) * DV + e[None, :], acc,
             mask=fok[:, None] & (e[None, :] < DV))
    if dvb == 0:
        tl.store(pz_ptr + base * F + f, accz, mask=fok)
        tl.store(pm_ptr + base * n_f + fb, mx)


@P.tuned(["F", "DV"])
@triton.jit
def _combine(ps_ptr, pz_ptr, pm_ptr, s_ptr, z_ptr, m_ptr, T, F, DV, N_F,
             BLOCK_F: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_NF: tl.constexpr):
    """[S | s] of head bh at M = max of the tiles' maxima: sum over tiles t = 0, 1, ... of
    exp2(M_t - M) [S_t | s_t] (a fixed order: the result does not depend on scheduling)."""
    bh = tl.program_id(0).to(tl.int64)
    fb = tl.program_id(1)
    dvb = tl.program_id(2)
    j = tl.arange(0, BLOCK_NF)
    big = tl.full([BLOCK_NF], float("-inf"), tl.float32)
    for t in range(0, T):
        big = tl.maximum(big, tl.load(pm_ptr + (bh * T + t) * N_F + j, mask=j < N_F,
                                      other=float("-inf")))
    mx = tl.max(big, 0)
    f = fb * BLOCK_F + tl.arange(0, BLOCK_F)
    e = dvb * BLOCK_DV + tl.arange(0, BLOCK_DV)
    mask = (f[:, None] < F) & (e[None, :] < DV)
    acc = tl.zeros([BLOCK_F, BLOCK_DV], dtype=tl.float32)
    accz = tl.zeros([BLOCK_F], dtype=tl.float32)
    for t in range(0, T):
        mt = tl.load(pm_ptr + (bh * T + t) * N_F + fb)
        r = tl.where(mt == float("-inf"), 0.0, tl.exp2(mt - mx))
        base = bh * T + t
        acc += r * tl.load(ps_ptr + (base * F + f[:, None]) * DV + e[None, :], mask=mask, other=0.0)
        accz += r * tl.load(pz_ptr + base * F + f, mask=f < F, other=0.0)
    tl.store(s_ptr + (bh * F + f[:, None]) * DV + e[None, :], acc, mask=mask)
    if dvb == 0:
        tl.store(z_ptr + bh * F + f, accz, mask=f < F)
    if (fb == 0) & (dvb == 0):
        tl.store(m_ptr + bh, mx)


@triton.jit
def _finish(y_ptr, den_ptr, c_ptr, num, den, c, rows, inside, e, DV, N, bh, first):
    """y = num / den, or zeros where the row's den is not > 0 or its quotient not finite
    (within the Dv tile); the statistics den and c from the first Dv tile."""
    y = num / tl.where(den > 0, den, 1.0)[:, None]
    fin = tl.max(tl.where(tl.abs(y) < float("inf"), 0.0, 1.0), 1) == 0.0
    good = (den > 0) & fin
    y = tl.where(good[:, None], y, 0.0)
    tl.store(y_ptr + bh * N * DV + rows[:, None] * DV + e[None, :], y.to(y_ptr.dtype.element_ty),
             mask=inside[:, None] & (e[None, :] < DV))
    if first:
        tl.store(den_ptr + bh * N + rows, den, mask=inside)
        tl.store(c_ptr + bh * N + rows, c, mask=inside)


@P.tuned(["D", "F", "DV"])
@triton.jit
def _bidir_queries(q_ptr, w_ptr, b_ptr, s_ptr, z_ptr, y_ptr, den_ptr, c_ptr,
                   N, D, DV, F, m, W_SETS, B_SETS,
                   KIND: tl.constexpr, HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_DV: tl.constexpr):
    """Query tile of head bh against the combined [S | s]: c_i = max over live f of
    (l2_if + log2 s_f) (EXP kinds; TRIG psi = [sin a, cos a], c_i = 0), psi, the ratio."""
    i = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    dvb = tl.program_id(2)
    rows = i * BLOCK_N + tl.arange(0, BLOCK_N)
    inside = rows < N
    d = tl.arange(0, BLOCK_D)
    x = tl.load(q_ptr + bh * N * D + rows[:, None] * D + d[None, :],
                mask=inside[:, None] & (d[None, :] < D), other=0.0).to(tl.float32)
    e = dvb * BLOCK_DV + tl.arange(0, BLOCK_DV)
    wp = w_ptr + (bh % W_SETS) * m * D
    bp = b_ptr + (bh % B_SETS) * m
    c = tl.zeros([BLOCK_N], dtype=tl.float32)
    if KIND != 2:
        c = tl.full([BLOCK_N], float("-inf"), tl.float32)
        for f0 in range(0, F, BLOCK_F):
            f = f0 + tl.arange(0, BLOCK_F)
            w, bias, lw, sign, fok = feature_tile(wp, bp, bp, f, m, F, D, KIND, HAS_BIAS, False,
                                                  BLOCK_D)
            lq = query_log2(project(x, w, bias, PRECISION), sign)
            z = tl.load(z_ptr + bh * F + f, mask=fok, other=0.0)
            c = tl.maximum(c, tl.max(shift_terms(lq, z[None, :]), 1))
    num = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    den = tl.zeros([BLOCK_N], dtype=tl.float32)
    for f0 in range(0, F, BLOCK_F):
        f = f0 + tl.arange(0, BLOCK_F)
        w, bias, lw, sign, fok = feature_tile(wp, bp, bp, f, m, F, D, KIND, HAS_BIAS, False,
                                              BLOCK_D)
        a = project(x, w, bias, PRECISION)
        z = tl.load(z_ptr + bh * F + f, mask=fok, other=0.0)
        if KIND == 2:
            psi = tl.where(fok[None, :], amplitude(a, f, m), 0.0)
        else:
            psi = query_features(query_log2(a, sign), c[:, None], z[None, :])
        den += tl.sum(psi * z[None, :], 1)
        st = tl.load(s_ptr + (bh * F + f[:, None]) * DV + e[None, :],
                     mask=fok[:, None] & (e[None, :] < DV), other=0.0)
        num += tl.dot(psi, st, input_precision=PRECISION)
    _finish(y_ptr, den_ptr, c_ptr, num, den, c, rows, inside, e, DV, N, bh, dvb == 0)


@P.tuned(["F", "DV"])
@triton.jit
def _scan(ps_ptr, pz_ptr, pm_ptr, hs_ptr, hz_ptr, hb_ptr, NC, F, DV, N_F,
          BLOCK_F: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_NF: tl.constexpr):
    """Boundary states of head bh: H_c = [S | s] of the keys before chunk c at B_c, the max
    of their log2-features (-inf, zeros for c = 0), for c = 0 .. NC (H_NC is the total).
    H_(c+1) = exp2(B_c - B_(c+1)) H_c + exp2(M_c,fb - B_(c+1)) U_c, U_c chunk c's partial."""
    bh = tl.program_id(0).to(tl.int64)
    fb = tl.program_id(1)
    dvb = tl.program_id(2)
    f = fb * BLOCK_F + tl.arange(0, BLOCK_F)
    e = dvb * BLOCK_DV + tl.arange(0, BLOCK_DV)
    mask = (f[:, None] < F) & (e[None, :] < DV)
    j = tl.arange(0, BLOCK_NF)
    h = tl.zeros([BLOCK_F, BLOCK_DV], dtype=tl.float32)
    hz = tl.zeros([BLOCK_F], dtype=tl.float32)
    b = tl.full([], float("-inf"), tl.float32)
    first = dvb == 0
    for c in range(0, NC):
        base = bh * (NC + 1) + c
        tl.store(hs_ptr + (base * F + f[:, None]) * DV + e[None, :], h, mask=mask)
        if first:
            tl.store(hz_ptr + base * F + f, hz, mask=f < F)
        if (fb == 0) & first:
            tl.store(hb_ptr + base, b)
        pm = tl.load(pm_ptr + (bh * NC + c) * N_F + j, mask=j < N_F, other=float("-inf"))
        bn = tl.maximum(b, tl.max(pm, 0))
        mt = tl.load(pm_ptr + (bh * NC + c) * N_F + fb)
        rh = tl.where(b == float("-inf"), 0.0, tl.exp2(b - bn))
        ru = tl.where(mt == float("-inf"), 0.0, tl.exp2(mt - bn))
        src = bh * NC + c
        h = h * rh + ru * tl.load(ps_ptr + (src * F + f[:, None]) * DV + e[None, :],
                                  mask=mask, other=0.0)
        hz = hz * rh + ru * tl.load(pz_ptr + src * F + f, mask=f < F, other=0.0)
        b = bn
    base = bh * (NC + 1) + NC
    tl.store(hs_ptr + (base * F + f[:, None]) * DV + e[None, :], h, mask=mask)
    if first:
        tl.store(hz_ptr + base * F + f, hz, mask=f < F)
    if (fb == 0) & first:
        tl.store(hb_ptr + base, b)


@triton.jit
def _chunk_tile(wp, bp, lp, f0, m, F, D, xk, xq, off, ok, ex, rb, hz_ptr, hbase,
                KIND: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_LOGW: tl.constexpr,
                PRECISION: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_D: tl.constexpr):
    """One feature tile of a causal chunk, for both walks of _causal_out: the chunk's key
    features phi at their running maxima, the rows' prefix normalisers P (the masked
    intra-chunk sum plus the boundary normaliser hz rescaled by rb), and the queries'
    projections aq. (f, sign, fok, phi, pre, aq)."""
    f = f0 + tl.arange(0, BLOCK_F)
    w, bias, lw, sign, fok = feature_tile(wp, bp, lp, f, m, F, D, KIND, HAS_BIAS, HAS_LOGW,
                                          BLOCK_D)
    ak = project(xk, w, bias, PRECISION)
    phi = key_features(key_log2(ak, sign, lw, KIND), off, ok, ak, f, m, KIND)
    hz = tl.load(hz_ptr + hbase * F + f, mask=fok, other=0.0)
    pre = tl.dot(ex, phi, input_precision=PRECISION) + rb[:, None] * hz[None, :]
    return f, sign, fok, phi, pre, project(xq, w, bias, PRECISION)


@P.tuned(["D", "F", "DV"])
@triton.jit
def _causal_out(q_ptr, k_ptr, v_ptr, w_ptr, b_ptr, lw_ptr, r_ptr, keep_ptr, rm_ptr,
                hs_ptr, hz_ptr, hb_ptr, y_ptr, den_ptr, c_ptr, mrow_ptr,
                N, D, DV, F, m, H, W_SETS, B_SETS, L_SETS, R_SETS, N_F, norm_coef,
                KIND: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_LOGW: tl.constexpr,
                HAS_RATE: tl.constexpr, HAS_KEEP: tl.constexpr, PRECISION: tl.constexpr,
                C: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_DV: tl.constexpr):
    """Rows of chunk ci of head bh: row i at its running max M_i = max(B_c, max_{j<=i} m_j)
    reads key j <= i of the chunk with weight exp2(M_j - M_i) and the boundary state with
    exp2(B_c - M_i); P_i (the prefix normaliser for c_i) is the same masked sum of phi."""
    ci = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    dvb = tl.program_id(2)
    nc = tl.num_programs(0)
    idx = tl.arange(0, C)
    rows = ci * C + idx
    inside = rows < N
    ok = inside
    if HAS_KEEP:
        ok = ok & (tl.load(keep_ptr + (bh // H) * N + rows, mask=inside, other=0) != 0)
    d = tl.arange(0, BLOCK_D)
    xmask = inside[:, None] & (d[None, :] < D)
    xk = tl.load(k_ptr + bh * N * D + rows[:, None] * D + d[None, :], mask=xmask,
                 other=0.0).to(tl.float32)
    xq = tl.load(q_ptr + bh * N * D + rows[:, None] * D + d[None, :], mask=xmask,
                 other=0.0).to(tl.float32)
    rate = 0.0
    if HAS_RATE:
        rate = tl.load(r_ptr + bh % R_SETS)
    g = key_offset(xk, rows, norm_coef, rate, HAS_RATE)
    # each key's max over all features, then the running max of the rows
    mk = tl.full([C], float("-inf"), tl.float32)
    for fb in range(0, N_F):
        mk = tl.maximum(mk, tl.load(rm_ptr + (bh * N_F + fb) * N + rows, mask=inside,
                                    other=float("-inf")))
    mk = tl.where(ok, mk, float("-inf"))
    hbase = bh * (nc + 1) + ci
    bc = tl.load(hb_ptr + hbase)
    tri = idx[None, :] <= idx[:, None]  # [i, j]: key j visible to row i
    mi = tl.maximum(tl.max(tl.where(tri, mk[None, :], float("-inf")), 1), bc)
    mis = tl.where(mi == float("-inf"), 0.0, mi)
    # key j's own running max is row j's: same positions
    vis = tri & ok[None, :]
    ex = tl.exp2(tl.where(vis, mis[None, :] - mis[:, None], float("-inf")))  # [i, j] <= 1
    rb = tl.where(bc == float("-inf"), 0.0, tl.exp2(bc - mis))
    off = key_shift(g, mis, ok)
    wp = w_ptr + (bh % W_SETS) * m * D
    bp = b_ptr + (bh % B_SETS) * m
    lp = lw_ptr + (bh % L_SETS) * m
    e = dvb * BLOCK_DV + tl.arange(0, BLOCK_DV)
    c = tl.zeros([C], dtype=tl.float32)
    if KIND != 2:
        c = tl.full([C], float("-inf"), tl.float32)
        for f0 in range(0, F, BLOCK_F):
            f, sign, fok, phi, pre, aq = _chunk_tile(
                wp, bp, lp, f0, m, F, D, xk, xq, off, ok, ex, rb, hz_ptr, hbase, KIND,
                HAS_BIAS, HAS_LOGW, PRECISION, BLOCK_F, BLOCK_D)
            c = tl.maximum(c, tl.max(shift_terms(query_log2(aq, sign), pre), 1))
    att = tl.zeros([C, C], dtype=tl.float32)
    inter = tl.zeros([C, BLOCK_DV], dtype=tl.float32)
    den = tl.zeros([C], dtype=tl.float32)
    for f0 in range(0, F, BLOCK_F):
        f, sign, fok, phi, pre, aq = _chunk_tile(
            wp, bp, lp, f0, m, F, D, xk, xq, off, ok, ex, rb, hz_ptr, hbase, KIND,
            HAS_BIAS, HAS_LOGW, PRECISION, BLOCK_F, BLOCK_D)
        if KIND == 2:
            psi = tl.where(fok[None, :], amplitude(aq, f, m), 0.0)
        else:
            psi = query_features(query_log2(aq, sign), c[:, None], pre)
        den += tl.sum(psi * pre, 1)
        att += tl.dot(psi, tl.trans(phi), input_precision=PRECISION)
        hs = tl.load(hs_ptr + (hbase * F + f[:, None]) * DV + e[None, :],
                     mask=fok[:, None] & (e[None, :] < DV), other=0.0)
        inter += tl.dot(psi, hs, input_precision=PRECISION)
    v = tl.load(v_ptr + bh * N * DV + rows[:, None] * DV + e[None, :],
                mask=inside[:, None] & (e[None, :] < DV), other=0.0).to(tl.float32)
    num = tl.dot(att * ex, v, input_precision=PRECISION) + inter * rb[:, None]
    _finish(y_ptr, den_ptr, c_ptr, num, den, c, rows, inside, e, DV, N, bh, dvb == 0)
    if dvb == 0:
        tl.store(mrow_ptr + bh * N + rows, mi, mask=inside)


def _splits(key_splits, n_tiles, programs, q):
    """Key splits per head (bidirectional): given, or 2 under the interpreter (so the tests
    walk several tiles per program), or enough for ~2 waves of programs on the device."""
    if key_splits is not None:
        if not isinstance(key_splits, int) or key_splits < 1:
            raise ValueError(f"key_splits: {key_splits!r} must be a positive int")
        return min(key_splits, n_tiles)
    if P.interpreting():
        return min(2, n_tiles)
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 132
    return max(1, min(n_tiles, triton.cdiv(2 * sms, programs)))


def forward(q, k, v, W, bias, key_logw, rate, norm_coef, kind, causal, keep, heads, *,
            chunk=64, precision="tf32", block_f=None, block_dv=None, key_splits=None,
            return_stats=False):
    """FAVOR attention of q [BH, Nq, D], k [BH, Nk, D], v [BH, Nk, Dv] (contiguous, fp32 /
    fp16 / bf16; Nq = Nk when causal) with the canonical map (W [sets, m, D] fp32 with
    sqrt(scale) folded in, bias [sets, m], key_logw [sets, m], rate [sets] (causal only),
    norm_coef, kind 0 EXP / 1 EXP_PM / 2 TRIG; keep [B, Nk] bool or int8; heads = H).
    Returns y [BH, Nq, Dv] in q's dtype; with return_stats=True (y, stats), stats a dict of
    fp32 tensors (log2 units: natural = value * ln 2):
      "scale": the key scale M2: [BH] bidirectional, [BH, Nq] causal (row i's running max;
               -inf where no key is seen);
      "shift": the query shift c2 [BH, Nq] (0 for TRIG; -inf for a row with no live feature);
      "denominator": psi_i . s [BH, Nq] (>= 1 for EXP kinds wherever a key is seen);
      "S", "s": bidirectional [BH, F, Dv], [BH, F] at "scale"; causal [BH, NC + 1, F, Dv],
               [BH, NC + 1, F], the states before each chunk and the total, at "boundary"
               [BH, NC + 1] (the total and its scale: a decoder state after prefill).
    chunk: the causal chunk C (a power of two >= 16); precision: tl.dot's input precision
    ('tf32' fast: the exponents a = W x then carry ~2^-11 relative error, ~0.5 % in a
    feature at |a| ~ 10; 'tf32x3' about fp32 at three passes; 'ieee' exact fp32); block_f,
    block_dv: feature and value tile sizes (powers of two >= 16; by default 64 (16 in the
    causal output pass) and min(Dv, 128));
    key_splits: programs per head and feature tile over the keys (bidirectional; by default
    enough for two waves on the device)."""
    P.check_rows(q, "q", None)
    bh, nq, d = q.shape
    P.check_rows(k, "k", bh, d=d)
    nk = k.shape[1]
    P.check_rows(v, "v", bh, n=nk)
    dv = v.shape[2]
    P.check_precision(precision)
    if causal and nq != nk:
        raise ValueError(f"q: causal attention needs Nq = Nk, got {nq} and {nk}")
    if chunk < 16 or chunk & (chunk - 1):
        raise ValueError(f"chunk: {chunk} must be a power of two >= 16")
    (W, bias, key_logw, rate), sets, m, F, flags = P.map_parameters(
        W, bias, key_logw, rate, norm_coef, kind, bh, heads, d, q.device, causal)
    keep = P.keep_mask(keep, bh // heads, nk, q.device)
    bf = P.pow2(min(F, 64)) if block_f is None else block_f
    bdv = P.pow2(min(dv, 128)) if block_dv is None else block_dv
    for b_, name in ((bf, "block_f"), (bdv, "block_dv")):
        if b_ < 16 or b_ & (b_ - 1):
            raise ValueError(f"{name}: {b_} must be a power of two >= 16")
    bd = P.pow2(d)
    n_f, n_dv = triton.cdiv(F, bf), triton.cdiv(dv, bdv)
    block_n = chunk if causal else (16 if P.interpreting() else 64)
    n_t = triton.cdiv(nk, block_n)
    tpp = 1 if causal else triton.cdiv(n_t, _splits(key_splits, n_t, bh * n_f * n_dv, q))
    n_p = triton.cdiv(n_t, tpp)
    f32 = dict(dtype=torch.float32, device=q.device)
    ps = torch.empty(bh, n_p, F, dv, **f32)
    pz = torch.empty(bh, n_p, F, **f32)
    pm = torch.empty(bh, n_p, n_f, **f32)
    rm = torch.empty(bh, n_f, nk, **f32) if causal else pm
    keep_arg = W if keep is None else keep
    common = dict(KIND=kind, HAS_BIAS=flags["HAS_BIAS"], PRECISION=precision, BLOCK_F=bf,
                  BLOCK_D=bd, BLOCK_DV=bdv, **P.launch_options(NUM_WARPS))
    _key_partials[(n_p, bh, n_f * n_dv)](
        k, v, W, bias, key_logw, rate, keep_arg, ps, pz, pm, rm,
        nk, d, dv, F, m, heads, *sets, float(norm_coef), tpp, n_dv, HAS_LOGW=flags["HAS_LOGW"],
        HAS_RATE=flags["HAS_RATE"], HAS_KEEP=keep is not None, STORE_ROWMAX=causal,
        BLOCK_N=block_n, **common)
    y = torch.empty(bh, nq, dv, dtype=q.dtype, device=q.device)
    den = torch.empty(bh, nq, **f32)
    shift = torch.empty(bh, nq, **f32)
    bnf = P.pow2(n_f, 1)
    if not causal:
        S = torch.empty(bh, F, dv, **f32)
        s = torch.empty(bh, F, **f32)
        scale = torch.empty(bh, **f32)
        _combine[(bh, n_f, n_dv)](ps, pz, pm, S, s, scale, n_p, F, dv, n_f, BLOCK_F=bf,
                                  BLOCK_DV=bdv, BLOCK_NF=bnf,
                                  **P.launch_options(NUM_WARPS))
        bq = 16 if P.interpreting() else 64
        _bidir_queries[(triton.cdiv(nq, bq), bh, n_dv)](
            q, W, bias, S, s, y, den, shift, nq, d, dv, F, m, sets[0], sets[1],
            BLOCK_N=bq, **common)
        stats = dict(scale=scale, shift=shift, denominator=den, S=S, s=s)
    else:
        S = torch.empty(bh, n_t + 1, F, dv, **f32)
        s = torch.empty(bh, n_t + 1, F, **f32)
        hb = torch.empty(bh, n_t + 1, **f32)
        _scan[(bh, n_f, n_dv)](ps, pz, pm, S, s, hb, n_t, F, dv, n_f, BLOCK_F=bf,
                               BLOCK_DV=bdv, BLOCK_NF=bnf, **P.launch_options(NUM_WARPS))
        scale = torch.empty(bh, nq, **f32)
        _causal_out[(n_t, bh, n_dv)](
            q, k, v, W, bias, key_logw, rate, keep_arg, rm, S, s, hb, y, den, shift, scale,
            nq, d, dv, F, m, heads, *sets, n_f, float(norm_coef), HAS_LOGW=flags["HAS_LOGW"],
            HAS_RATE=flags["HAS_RATE"], HAS_KEEP=keep is not None, C=chunk,
            **{**common, "BLOCK_F": CAUSAL_BLOCK_F if block_f is None else bf})
        stats = dict(scale=scale, shift=shift, denominator=den, S=S, s=s, boundary=hb)
    return (y, stats) if return_stats else y
