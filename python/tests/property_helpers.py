"""Strategies and float64 oracles of the property tests (test_properties*.py).

Inputs are drawn as (shape, options, seed, norm): Hypothesis shrinks the shapes and
options, numpy's seeded generator fills the arrays (fast, and normal entries rather than
the subnormals and 1e308s that element-wise strategies favour; large norms are drawn on
purpose instead).

The oracles are float64 numpy evaluations written from docs/math.md, independent of the
library's code: exact softmax (exact_oracle) and the FAVOR ratio
phi(Q) (phi(K)^T V) / phi(Q) (phi(K)^T 1) from the call's projection matrix
(favor_oracle), both with the rules of docs/numerics.md (rows with no visible key, or a
denominator not > 0, are zeros). Both work in log space per (query, key) pair, so norms
whose features overflow even double (exp(|x|^2/2)) are still evaluated.

Tolerances come from float32 rounding (u = 2^-24) of what the library computes; see
exact_bound and favor_bound.
"""
import contextlib
import math

import numpy as np
from hypothesis import note, strategies as st

import favor
from conftest import head_map

U32 = 2.0 ** -24  # float32 unit roundoff
PROJECTIONS = ("iid", "orthogonal", "radial", "qmc", "sorf", "simplex", "dct")
RANDOM_KERNELS = ("positive", "trig", "hyperbolic", "favorpp")  # FAVOR++ with a fixed A


@st.composite
def problems(draw, max_n=20, max_d=12, max_dv=6, max_norm=6.0, causal=None):
    """A dict: q [B, H, Nq, D], k [B, H, Nk, D], v [B, H, Nk, Dv] (float32), key_mask
    [B, Nk] bool or None, causal, scale (None = 1/sqrt(D)). Row norms of q and k are
    drawn (up to max_norm; some rows zero or repeated); masks may hide every key of a
    batch entry."""
    b, h = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    causal = draw(st.booleans()) if causal is None else causal
    nk = draw(st.integers(1, max_n))
    nq = nk if causal else draw(st.integers(1, max_n))
    d, dv = draw(st.integers(1, max_d)), draw(st.integers(1, max_dv))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = rows(rng, (b, h, nq, d), draw(st.floats(0.0, max_norm)), draw(row_kinds))
    k = rows(rng, (b, h, nk, d), draw(st.floats(0.0, max_norm)), draw(row_kinds))
    v = (rng.standard_normal((b, h, nk, dv)) * draw(st.sampled_from([1.0, 1e-3, 1e3])))
    mask_kind = draw(st.sampled_from(["none", "random", "all-masked-row", "sparse"]))
    mask = None
    if mask_kind != "none":
        keep = {"random": 0.6, "all-masked-row": 0.6, "sparse": 0.15}[mask_kind]
        mask = rng.random((b, nk)) < keep
        if mask_kind == "all-masked-row":
            mask[rng.integers(b)] = False
    scale = draw(st.sampled_from([None, None, 1.0, 0.05]))
    return dict(q=q, k=k, v=v.astype(np.float32), key_mask=mask, causal=causal, scale=scale)


row_kinds = st.sampled_from(["normal", "zero-rows", "repeated", "one-large"])


def rows(rng, shape, norm, kind):
    """float32 [..., N, D] rows of Euclidean norm `norm` in random directions; kind
    'zero-rows' zeroes some rows, 'repeated' repeats the first row, 'one-large' makes one
    row 4x longer (one key dominating the softmax)."""
    x = rng.standard_normal(shape)
    x *= norm / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-30)
    n = shape[-2]
    if kind == "zero-rows":
        x[..., rng.random(n) < 0.3, :] = 0.0
    elif kind == "repeated":
        x[..., :, :] = x[..., :1, :]
    elif kind == "one-large":
        x[..., rng.integers(n), :] *= 4.0
    return x.astype(np.float32)


@st.composite
def projections(draw, d):
    """A favor.Projection for head dim d: a kind, m and seed (chi norms)."""
    kind = draw(st.sampled_from([k for k in PROJECTIONS if d >= 2 or k != "simplex"]))
    m, seed = draw(st.integers(1, 40)), draw(st.integers(0, 2**16))
    note(f"projection: Projection.draw({m}, {d}, kind={kind!r}, seed={seed})")
    return favor.Projection.draw(m, d, kind=kind, seed=seed)


def visibility(b, nq, nk, causal, key_mask):
    """bool [B, Nq, Nk]: key j visible from query i."""
    vis = np.ones((b, nq, nk), dtype=bool)
    if causal:
        vis &= np.tril(np.ones((nq, nk), dtype=bool))[None]
    if key_mask is not None:
        vis &= np.asarray(key_mask, dtype=bool)[:, None, :]
    return vis


def scale_of(p):
    return 1.0 / math.sqrt(p["q"].shape[-1]) if p["scale"] is None else p["scale"]


def _weighted(logw, vis, v):
    """y = sum_j w_ij v_j / sum_j w_ij for signed weights given as (log|w|, sign) per
    (i, j), hidden pairs dropped; also the row's magnitude weights |w| / |den| (for the
    bounds) and whether the row is defined (some visible key and den > 0)."""
    logmag, sign = logw
    logmag = np.where(vis, logmag, -np.inf)
    top = logmag.max(axis=1, keepdims=True)
    any_key = np.isfinite(top[:, 0])
    mag = np.exp(logmag - np.where(np.isfinite(top), top, 0.0))
    w = sign * mag
    den = w.sum(axis=1)
    ok = any_key & (den > 0)
    safe = np.where(ok, den, 1.0)
    y = np.where(ok[:, None], (w @ v) / safe[:, None], 0.0)
    return y, mag / np.abs(safe)[:, None], den / np.where(any_key, mag.sum(axis=1), 1.0), ok


def exact_oracle(p):
    """float64 softmax attention of the float32 inputs: (y, weights p_ij, defined rows)."""
    q, k, v = (np.asarray(p[n], dtype=np.float64) for n in ("q", "k", "v"))
    b, h, nq, _ = q.shape
    vis = visibility(b, nq, k.shape[2], p["causal"], p["key_mask"])
    y = np.zeros((b, h, nq, v.shape[3]))
    wts = np.zeros((b, h, nq, k.shape[2]))
    ok = np.zeros((b, h, nq), dtype=bool)
    for bi in range(b):
        for hi in range(h):
            s = scale_of(p) * q[bi, hi] @ k[bi, hi].T
            y[bi, hi], wts[bi, hi], _, ok[bi, hi] = _weighted((s, 1.0), vis[bi], v[bi, hi])
    return y, wts, ok


def exact_bound(p, y_ref, wts):
    """Elementwise bound on |y_f32 - y_ref| for exact attention in float32: a logit
    s = scale q.k carries at most (D + 2) u scale |q| |k| of rounding (the dot product, the
    scaling), exp(s - max) adds u |s - max| + u, and the sums over Nk keys add Nk u
    relative: every weight p_ij is off by a relative delta_i. Since y_i is a convex
    combination, |dy_ic| <= delta_i sum_j p_ij (|v_jc| + |y_ic|) (to first order; x1.5 for
    the second order and the final rounding of y)."""
    q, k, v = (np.asarray(p[n], dtype=np.float64) for n in ("q", "k", "v"))
    d, nk = q.shape[3], k.shape[2]
    sc = scale_of(p)
    qn, kn = np.linalg.norm(q, axis=-1), np.linalg.norm(k, axis=-1)
    logit = sc * qn * kn.max(axis=-1, keepdims=True)           # >= |s_ij| for every j
    delta = U32 * ((d + 2) * logit + 2 * logit + 2 * nk + 8)     # [B, H, Nq]
    spread = wts @ np.abs(v) + np.abs(y_ref) * wts.sum(-1, keepdims=True)
    return 1.5 * delta[..., None] * spread + 1e-30


def exact_f64_bound(p, y_ref, wts):
    """Elementwise bound for accumulate='f64': scores, sums and the division in double, then
    one rounding to float32 (u |y|); and sqrt(scale) is held as a float (FeatureParams), so
    the scale itself is off by up to 3u relative, moving logit s_ij by 3u |s_ij| and each
    weight by 6u max_j |s_ij| relative (the same weighted spread as exact_bound)."""
    q, k, v = (np.asarray(p[n], dtype=np.float64) for n in ("q", "k", "v"))
    logit = scale_of(p) * np.linalg.norm(q, axis=-1) * \
        np.linalg.norm(k, axis=-1).max(axis=-1, keepdims=True)
    spread = wts @ np.abs(v) + np.abs(y_ref) * wts.sum(-1, keepdims=True)
    return (1.0001 * U32 * np.abs(y_ref) + 1.5 * 6 * U32 * logit[..., None] * spread
            + 1e-12 * np.abs(y_ref).max(initial=0) + 1e-30)


def log_features(x, w, kernel, scale, fit, bh):
    """log|phi(x)| and sign(phi(x)), float64 [N, F], for one head (docs/math.md; the
    constants are kept, though they cancel), and the largest |exponent| term of the
    rounding (|w_f| |x| + |x|^2 + |bias|) per row for the bound."""
    W, bias, log_c = head_map(w, kernel, fit, bh)
    xs = math.sqrt(scale) * np.asarray(x, dtype=np.float64)
    n2 = np.sum(xs * xs, axis=-1, keepdims=True)
    a = xs @ W.T + bias
    size = np.linalg.norm(W, axis=1).max(initial=0.0) * np.sqrt(n2[:, 0]) + n2[:, 0] \
        + np.abs(bias).max(initial=0.0)
    if kernel == "trig":
        s = np.concatenate([np.sin(a), np.cos(a)], axis=-1)
        with np.errstate(divide="ignore"):
            return log_c + n2 / 2 + np.log(np.abs(s)), np.sign(s), size
    if kernel == "hyperbolic":
        la = log_c - n2 / 2 + np.concatenate([a, -a], axis=-1)
        return la, np.ones_like(la), size
    return log_c + a - n2 / 2, np.ones_like(a), size


def favor_oracle(p, w, kernel, fit=None):
    """float64 FAVOR attention y_i = sum_j A_ij v_j / sum_j A_ij with A_ij = phi(q_i).phi(k_j)
    from the projection w (every pair summed over features in log space). Returns
    (y, magnitude weights sum_f |phi_f(q_i) phi_f(k_j)| / |den_i|, den_i / sum_j |A_ij|
    (the row's cancellation; 1 for positive features), defined rows, size of exponents)."""
    q, k, v = (np.asarray(p[n], dtype=np.float64) for n in ("q", "k", "v"))
    b, h, nq, _ = q.shape
    nk = k.shape[2]
    sc = scale_of(p)
    vis = visibility(b, nq, nk, p["causal"], p["key_mask"])
    out = [np.zeros((b, h, nq, v.shape[3])), np.zeros((b, h, nq, nk)), np.zeros((b, h, nq)),
           np.zeros((b, h, nq), dtype=bool), np.zeros((b, h, nq))]
    for bi in range(b):
        for hi in range(h):
            lq, sq, zq = log_features(q[bi, hi], w, kernel, sc, fit, bi * h + hi)
            lk, sk, zk = log_features(k[bi, hi], w, kernel, sc, fit, bi * h + hi)
            pair = lq[:, None, :] + lk[None, :, :]                       # [Nq, Nk, F]
            top = pair.max(axis=2, keepdims=True)
            top = np.where(np.isfinite(top), top, 0.0)
            terms = np.exp(pair - top)
            signed = (terms * (np.asarray(sq)[:, None] * np.asarray(sk)[None])).sum(axis=2)
            mag = terms.sum(axis=2)
            with np.errstate(divide="ignore"):
                logw = (top[..., 0] + np.log(np.abs(signed)), np.sign(signed))
                logm = np.where(vis[bi], top[..., 0] + np.log(mag), -np.inf)
            y, _, ratio, ok = _weighted(logw, vis[bi], v[bi, hi])
            # magnitude weights relative to |den| (same shift as _weighted used)
            shift = np.max(np.where(vis[bi], logw[0], -np.inf), axis=1, keepdims=True)
            shift = np.where(np.isfinite(shift), shift, 0.0)
            den = np.where(vis[bi], logw[1] * np.exp(logw[0] - shift), 0.0).sum(axis=1)
            magw = np.exp(logm - shift) / np.where(ok, np.abs(den), 1.0)[:, None]
            out[0][bi, hi], out[1][bi, hi], out[2][bi, hi] = y, magw, ratio
            out[3][bi, hi] = ok
            out[4][bi, hi] = zq[:, None].max(axis=1) + zk.max(initial=0.0)
    return tuple(out)


def favor_bound(p, y_ref, magw, size, m_features):
    """Elementwise bound on |y_f32 - y_ref| for FAVOR in float32. A log-feature
    L = w_f.x - |x|^2/2 (+ bias) is a length-D dot product plus two terms, each rounded
    once: absolute error <= (D + 4) u size, size = |w_f||x| + |x|^2 + |bias| (per query,
    plus the largest key's); the stabilising shifts are of the same size; exp and the
    products add u each, the sums over F features and Nk keys (F + Nk) u relative to
    their magnitudes. So every pair term A_ij = phi(q_i).phi(k_j) is off by at most
    delta_i sum_f |phi_f(q_i) phi_f(k_j)|, and
    |dy_ic| <= delta_i sum_j |A|_ij (|v_jc| + |y_ic|) / |den_i| (x1.5 for second order and
    the final rounding). For positive features |A| = A and this is a weighted average; for
    trig, rows whose denominator cancels get a large bound, as they should."""
    v = np.asarray(p["v"], dtype=np.float64)
    d, nk = p["q"].shape[3], p["k"].shape[2]
    delta = U32 * (2 * (d + 4) * size + 2 * (m_features + nk) + 8)     # [B, H, Nq]
    spread = magw @ np.abs(v) + np.abs(y_ref) * magw.sum(-1, keepdims=True)
    return 1.5 * delta[..., None] * spread + 1e-30


def key_feature_spread(p, w, kernel, fit=None):
    """The largest spread max_f L_jf - min_f L_jf of one key's log-features (over keys and
    heads; 0 for trig, whose features carry no per-feature exponent). FAVOR stabilises keys
    by one max over keys and features, so a feature whose key sum falls ~87 below it
    underflows in float32 and is dropped ("dead", docs/numerics.md), though the query side
    may weight it by up to exp(spread). With every key's spread < 80 no feature can die:
    at the key that attains the max, every feature is within 80 of it."""
    if kernel == "trig":
        return 0.0
    k = np.asarray(p["k"], dtype=np.float64)
    b, h = k.shape[:2]
    worst = 0.0
    for bi in range(b):
        for hi in range(h):
            W, bias, _ = head_map(w, kernel, fit, bi * h + hi)
            a = math.sqrt(scale_of(p)) * k[bi, hi] @ W.T + bias
            if kernel == "hyperbolic":
                a = np.concatenate([a, -a], axis=-1)
            worst = max(worst, float((a.max(axis=1) - a.min(axis=1)).max(initial=0.0)))
    return worst


def exact_reference(p):
    """(y_ref, elementwise bound for the float32 path, defined rows) of exact attention."""
    y, wts, ok = exact_oracle(p)
    return y, exact_bound(p, y, wts), ok


def favor_reference(p, w, kernel, fit=None):
    """(y_ref, elementwise bound, defined rows, cancellation ratio) of FAVOR with projection
    w; fit: a KernelFit or a float A (FAVOR++)."""
    if isinstance(fit, float):
        fit = favor.KernelFit.constant(fit, w.d)
    y, magw, ratio, ok, size = favor_oracle(p, w, kernel, fit)
    f = 2 * w.m if kernel in ("trig", "hyperbolic") else w.m
    return y, favor_bound(p, y, magw, size, f), ok, ratio


def one_head(p, b, h, keep_rank=False):
    """Head (b, h) of problem p: [N, X] arrays and an [Nk] mask, or [1, 1, N, X] and
    [1, Nk] with keep_rank."""
    sl = (slice(b, b + 1), slice(h, h + 1)) if keep_rank else (b, h)
    one = {n: (x[sl] if n in "qkv" else x) for n, x in p.items()}
    if p["key_mask"] is not None:
        one["key_mask"] = p["key_mask"][sl[0]]
    return one


@contextlib.contextmanager
def threads(n):
    """favor.set_num_threads(n) inside the block; the previous count (and whether the user
    had set it) afterwards (conftest.single_thread, usable inside a Hypothesis test)."""
    from favor import _threads
    before, user_set = favor.num_threads(), _threads._user_set
    favor.set_num_threads(n)
    try:
        yield
    finally:
        favor.set_num_threads(before)
        _threads._user_set = user_set
