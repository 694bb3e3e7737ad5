"""The numpy API (favor.attention, exact_attention, attention_backward, features, fit_kernel,
KernelFit, Projection, make_projection, metrics, build info) against the double reference
favor.reference (same projection, same fit) and against numpy evaluations of the formulas.

Tolerances: docs/numerics.md; the 2x-naive-float32 rule is explained in conftest.py.
Bit-identical comparisons (np.array_equal) are used wherever favor runs the same code on
the same float32 values: the CPU kernels gather every tile of rows into a contiguous buffer
(src/cpu/feature_tile.cpp, exact_attention.cpp), so a strided view, a rank-2 array and a
converted copy all feed the kernels the same numbers in the same order.
"""
import math
import pickle
import subprocess
import sys

import numpy as np
import pytest

import favor
from conftest import (ADAPTED, KERNELS, assert_twice_naive, calibration_fit, rand,
                      naive_attention, naive_exact, naive_features, rel_err)

# ---------------------------------------------------------------- attention vs reference

B, H, D, DV, M = 2, 2, 8, 6, 24
# Row norm of q and k: |x| = |q| scale^1/2 = 1 at the default scale, the regime of
# docs/accuracy.md (and small enough that trig's denominators stay positive).
NORM = D ** 0.25


def problem(causal, seed=1, nq=41, nk=45):
    """q, k, v and a mask [B, Nk] that keeps key 0 (so every causal row sees a key) and
    drops every third key from 1 in batch 0, every fourth from 2 in batch 1."""
    nk = nq if causal else nk
    q = rand((B, H, nq, D), seed, NORM)
    k = rand((B, H, nk, D), seed + 1, NORM)
    v = rand((B, H, nk, DV), seed + 2)
    j = np.arange(nk)
    mask = np.stack([j % 3 != 1, j % 4 != 2])
    return q, k, v, mask


@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_attention_within_twice_naive_float32_of_reference(kernel, causal, masked):
    # nq = 41 crosses the causal chunk (32); nk != nq bidirectionally (cross attention).
    q, k, v, mask = problem(causal)
    key_mask = mask if masked else None
    w = favor.Projection.draw(M, D, seed=7)
    # Causal FAVOR++/FAVOR# need a fit from calibration data; bidirectional calls fit
    # themselves to q and k (fit=None), as the reference does.
    fit = calibration_fit(kernel, (B, H, 30, D), 100, NORM) if causal and kernel in ADAPTED \
        else None
    out = favor.attention(q, k, v, kernel=kernel, causal=causal, projection=w, key_mask=key_mask,
                          fit=fit, full_output=True)
    ref = favor.reference.favor_attention(q, k, v, w, kernel=kernel, causal=causal,
                                          key_mask=key_mask, fit=fit)
    naive = naive_attention(q, k, v, w, kernel, causal, None, key_mask, fit, np.float32)
    assert out.y.shape == (B, H, q.shape[2], DV) and out.y.dtype == np.float32
    assert out.zero_rows == 0
    assert_twice_naive(out.y, ref, naive, f"{kernel} causal={causal} masked={masked}")


def test_naive_double_model_equals_reference():
    # The naive numpy model behind the tolerance is the reference's formula: in double it
    # reproduces favor.reference to double rounding (so its float32 error is meaningful).
    q, k, v, mask = problem(causal=False)
    w = favor.Projection.draw(M, D, seed=7)
    for kernel in KERNELS:
        ref = favor.reference.favor_attention(q, k, v, w, kernel=kernel, key_mask=mask)
        model = naive_attention(q, k, v, w, kernel, False, None, mask, None, np.float64)
        assert rel_err(model, ref) < 1e-12, kernel


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_favorpp_with_a_float_a(causal):
    # fit=A (a float) is KernelFit.constant(A, D): the CLI's --fit-a.
    q, k, v, _ = problem(causal)
    w = favor.Projection.draw(M, D, seed=3)
    y = favor.attention(q, k, v, kernel="favorpp", causal=causal, projection=w, fit=-0.05)
    same = favor.attention(q, k, v, kernel="favorpp", causal=causal, projection=w,
                           fit=favor.KernelFit.constant(-0.05, D))
    assert np.array_equal(y, same)  # same fit, same code
    ref = favor.reference.favor_attention(q, k, v, w, kernel="favorpp", causal=causal,
                                          fit=favor.KernelFit.constant(-0.05, D))
    naive = naive_attention(q, k, v, w, "favorpp", causal, None, None, -0.05, np.float32)
    assert_twice_naive(y, ref, naive, "favorpp A=-0.05")


@pytest.mark.parametrize("kernel", ["positive", "trig", "hyperbolic"])
def test_attention_scale(kernel):
    q, k, v, _ = problem(causal=False)
    w = favor.Projection.draw(M, D, seed=5)
    y = favor.attention(q, k, v, kernel=kernel, projection=w, scale=0.2)
    ref = favor.reference.favor_attention(q, k, v, w, kernel=kernel, scale=0.2)
    naive = naive_attention(q, k, v, w, kernel, False, 0.2, None, None, np.float32)
    assert_twice_naive(y, ref, naive, f"{kernel} scale=0.2")
    assert not np.array_equal(y, favor.attention(q, k, v, kernel=kernel, projection=w))


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_all_keys_masked_gives_zero_rows(causal):
    q, k, v, mask = problem(causal)
    mask[0] = False  # batch 0 sees no key
    out = favor.attention(q, k, v, causal=causal, features=M, key_mask=mask, full_output=True)
    assert np.all(out.y[0] == 0)
    assert out.zero_rows == H * q.shape[2]
    assert np.all(np.any(out.y[1] != 0, axis=-1))
    assert np.all(favor.exact_attention(q, k, v, causal=causal, key_mask=mask)[0] == 0)


def test_full_output():
    q, k, v, _ = problem(causal=False)
    plain = favor.attention(q, k, v, features=M)
    out = favor.attention(q, k, v, features=M, full_output=True)
    assert isinstance(out, favor.AttentionOutput)
    assert np.array_equal(out.y, plain)  # saving the context changes nothing
    assert isinstance(out.context, favor.AttentionContext) and out.context.valid
    assert out.context.nbytes > 0
    # Causal attention has no position-independent state to save; exact has none at all.
    assert favor.attention(q, q, v[:, :, :q.shape[2]], causal=True, features=M,
                           full_output=True).context is None
    ex = favor.attention(q, k, v, method="exact", full_output=True)
    assert ex.context is None and ex.zero_rows == 0


@pytest.mark.parametrize("kind,norms", [("iid", "chi"), ("orthogonal", "chi"),
                                        ("orthogonal", "fixed"), ("radial", "chi"),
                                        ("radial", "quantile"), ("qmc", "chi"),
                                        ("sorf", "chi"), ("simplex", "fixed"),
                                        ("dct", "chi"), ("dct", "quantile")])
def test_projection_kinds_through_attention(kind, norms):
    # projection=<kind> draws Projection.draw(features, D, kind, norms, seed): same bits.
    q, k, v, _ = problem(causal=False)
    w = favor.Projection.draw(20, D, kind=kind, norms=norms, seed=11)
    assert (w.kind, w.norms, w.seed, w.m, w.d) == (kind, norms, 11, 20, D)
    mp = favor.make_projection(D, kind, features=20, norms=norms, seed=11)
    assert np.array_equal(mp.matrix, w.matrix)
    y = favor.attention(q, k, v, projection=kind, features=20, norms=norms, seed=11)
    assert np.array_equal(y, favor.attention(q, k, v, projection=w))
    ref = favor.reference.favor_attention(q, k, v, w)
    naive = naive_attention(q, k, v, w, "positive", False, None, None, None, np.float32)
    assert_twice_naive(y, ref, naive, kind)


def test_make_projection():
    w = favor.Projection.draw(16, D, seed=2)
    assert favor.make_projection(D, w) is w
    assert favor.make_projection(D, w, features=16) is w
    default = favor.make_projection(D)  # orthogonal, 256 features, chi, seed 0
    assert (default.m, default.d, default.kind, default.norms, default.seed) == \
        (256, D, "orthogonal", "chi", 0)
    assert np.array_equal(default.matrix, favor.Projection.draw(256, D).matrix)
    # attention's defaults are the same projection
    q, k, v, _ = problem(causal=False)
    assert np.array_equal(favor.attention(q, k, v), favor.attention(q, k, v, projection=default))
    assert not np.array_equal(favor.attention(q, k, v, seed=1), favor.attention(q, k, v))


# ---------------------------------------------------------------- exact attention

@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_exact_attention_vs_reference(causal, masked):
    q, k, v, mask = problem(causal, seed=21, nq=70, nk=90)
    key_mask = mask if masked else None
    ref = favor.reference.exact_attention(q, k, v, causal=causal, key_mask=key_mask)
    y = favor.exact_attention(q, k, v, causal=causal, key_mask=key_mask)
    naive = naive_exact(q, k, v, causal, None, key_mask, np.float32)
    assert rel_err(naive_exact(q, k, v, causal, None, key_mask, np.float64), ref) < 1e-12
    assert_twice_naive(y, ref, naive, f"exact causal={causal}")
    # f64 accumulation: only the final rounding to float32 remains, <= 2^-24 relative per
    # element; 2^-23 allows the rounding of the reference's own double sums on top.
    y64 = favor.exact_attention(q, k, v, causal=causal, key_mask=key_mask, accumulate="f64")
    assert rel_err(y64, ref) <= 2.0 ** -23
    # attention(method='exact') is the same call
    assert np.array_equal(favor.attention(q, k, v, method="exact", causal=causal,
                                          key_mask=key_mask, accumulate="f64"), y64)


def test_exact_attention_scale():
    q, k, v, _ = problem(causal=False, seed=3)
    ref = favor.reference.exact_attention(q, k, v, scale=0.7)
    y = favor.exact_attention(q, k, v, scale=0.7)
    assert_twice_naive(y, ref, naive_exact(q, k, v, False, 0.7, None, np.float32), "scale")


# ---------------------------------------------------------------- gradients

def quantised(x):
    """Rounds to multiples of 2^-12, so that x +- 2^-10 and x +- 2^-11 are exact in float32
    (|x| < 2^11) and the finite differences below perturb by exactly the step."""
    return (np.round(np.asarray(x, dtype=np.float64) * 4096) / 4096).astype(np.float32)


def richardson_fd(loss, x, step=2.0 ** -10):
    """Central differences of loss at x (float32, quantised) for every element, with one
    Richardson step: g = (4 D(h/2) - D(h)) / 3 has truncation error O(h^4) ~ 1e-12 for
    h = 2^-10; the double reference's rounding adds ~1e-16 / h ~ 1e-13."""
    g = np.zeros(x.shape)
    for idx in np.ndindex(x.shape):
        d = []
        for h in (step, step / 2):
            up, down = x.copy(), x.copy()
            up[idx] += np.float32(h)
            down[idx] -= np.float32(h)
            d.append((loss(up) - loss(down)) / (2 * h))
        g[idx] = (4 * d[1] - d[0]) / 3
    return g


# float32 gradients vs the (double-exact) finite differences. Each gradient entry of these
# 5-token heads (F <= 8, D = 3) goes through ~N + F + D = 16 float32 roundings of 2^-24,
# ~1e-6 relative; the backward subtracts nearly equal terms (dy.y against dy; the norm term
# against W^T dL/da), which can cost one more decimal digit: 1e-5. (Measured: <= 8e-7.)
GRAD_TOL = 1e-5


@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_attention_backward_vs_finite_differences(kernel, causal, masked):
    nq, nk, d, dv, m = (5, 5, 3, 2, 4) if causal else (4, 6, 3, 2, 4)
    q = quantised(rand((1, 1, nq, d), 31, 1.0))
    k = quantised(rand((1, 1, nk, d), 32, 1.0))
    v = quantised(rand((1, 1, nk, dv), 33))
    dy = rand((1, 1, nq, dv), 34).astype(np.float64)
    wm = quantised(favor.Projection.draw(m, d, seed=9).matrix)
    w = favor.Projection.from_matrix(wm)
    key_mask = np.array([[j != 2 for j in range(nk)]]) if masked else None
    # FAVOR++/FAVOR# gradients hold the fit fixed (docs/gradients.md): give one.
    fit = calibration_fit(kernel, (1, 1, 8, d), 40, 1.0) if kernel in ADAPTED else None
    fixed_kernel = kernel not in ADAPTED  # dW only for the fixed kernels

    def loss(qq=q, kk=k, vv=v, ww=w):
        y = favor.reference.favor_attention(qq, kk, vv, ww, kernel=kernel, causal=causal,
                                            key_mask=key_mask, fit=fit)
        return float(np.sum(dy * y))

    g = favor.attention_backward(q, k, v, dy.astype(np.float32), kernel=kernel, causal=causal,
                                 projection=w, key_mask=key_mask, fit=fit,
                                 projection_grad=fixed_kernel)
    assert g.dq.shape == q.shape and g.dk.shape == k.shape and g.dv.shape == v.shape
    assert rel_err(g.dq, richardson_fd(lambda x: loss(qq=x), q)) <= GRAD_TOL
    assert rel_err(g.dk, richardson_fd(lambda x: loss(kk=x), k)) <= GRAD_TOL
    assert rel_err(g.dv, richardson_fd(lambda x: loss(vv=x), v)) <= GRAD_TOL
    if masked:  # masked keys take no part: zero gradients, exactly
        assert np.all(g.dk[0, 0, 2] == 0) and np.all(g.dv[0, 0, 2] == 0)
    if fixed_kernel:
        fd_w = richardson_fd(lambda x: loss(ww=favor.Projection.from_matrix(x)), wm)
        assert g.dw.shape == (m, d)
        assert rel_err(g.dw, fd_w) <= GRAD_TOL
    else:
        assert g.dw is None


@pytest.mark.parametrize("kernel", KERNELS)
def test_backward_context_is_bit_identical_and_checked(kernel):
    q, k, v, mask = problem(causal=False, seed=41)
    dy = rand((B, H, q.shape[2], DV), 45)
    w = favor.Projection.draw(M, D, seed=4)
    out = favor.attention(q, k, v, kernel=kernel, projection=w, key_mask=mask, full_output=True)
    without = favor.attention_backward(q, k, v, dy, kernel=kernel, projection=w, key_mask=mask)
    with_ctx = favor.attention_backward(q, k, v, dy, kernel=kernel, projection=w, key_mask=mask,
                                        context=out.context)
    # The saved key state is the one the backward pass would recompute, by the same code
    # on the same values: the gradients are bit-identical.
    for a, b in zip(with_ctx[:3], without[:3]):
        assert np.array_equal(a, b)
    # A context from other inputs or options is refused, not used.
    k2 = k.copy()
    k2[1, 1, 3, 0] += 0.5
    v2 = v.copy()
    v2[0, 0, 0, 0] -= 0.25
    mask2 = mask.copy()
    mask2[0, 0] = False
    others = [dict(k=k2), dict(v=v2), dict(key_mask=mask2), dict(projection=w.redraw(5)),
              dict(kernel="hyperbolic" if kernel != "hyperbolic" else "positive")]
    for change in others:
        args = dict(q=q, k=k, v=v, kernel=kernel, projection=w, key_mask=mask)
        args.update(change)
        with pytest.raises(favor.Error, match="context"):
            favor.attention_backward(args.pop("q"), args.pop("k"), args.pop("v"), dy,
                                     context=out.context, **args)


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_exact_attention_backward_vs_finite_differences(causal):
    nq, nk = (5, 5) if causal else (4, 6)
    q = quantised(rand((1, 1, nq, 3), 51, 1.5))
    k = quantised(rand((1, 1, nk, 3), 52, 1.5))
    v = quantised(rand((1, 1, nk, 2), 53))
    dy = rand((1, 1, nq, 2), 54).astype(np.float64)
    mask = np.array([[j != 1 for j in range(nk)]])

    def loss(qq=q, kk=k, vv=v):
        return float(np.sum(dy * favor.reference.exact_attention(qq, kk, vv, causal=causal,
                                                                 key_mask=mask)))

    g = favor.exact_attention_backward(q, k, v, dy.astype(np.float32), causal=causal,
                                       key_mask=mask)
    assert g.dw is None
    # Same derivation as GRAD_TOL (softmax: dS = P (dP - D) subtracts nearly equal terms).
    assert rel_err(g.dq, richardson_fd(lambda x: loss(qq=x), q)) <= GRAD_TOL
    assert rel_err(g.dk, richardson_fd(lambda x: loss(kk=x), k)) <= GRAD_TOL
    assert rel_err(g.dv, richardson_fd(lambda x: loss(vv=x), v)) <= GRAD_TOL
    assert np.all(g.dk[0, 0, 1] == 0) and np.all(g.dv[0, 0, 1] == 0)


# ---------------------------------------------------------------- features

@pytest.mark.parametrize("kernel", KERNELS)
def test_features_vs_reference(kernel):
    x = rand((B, H, 30, D), 61, NORM)
    w = favor.Projection.draw(M, D, seed=8)
    fit = calibration_fit(kernel, (B, H, 20, D), 62, NORM) if kernel in ADAPTED else None
    phi = favor.features(x, kernel=kernel, projection=w, fit=fit)
    per_row = 2 * M if kernel in ("trig", "hyperbolic") else M
    assert phi.shape == (B, H, 30, per_row) and phi.dtype == np.float32
    ref = favor.reference.features(x, w, kernel=kernel, fit=fit)
    assert rel_err(naive_features(x, w, kernel, None, fit, np.float64), ref) < 1e-12
    # docs/numerics.md rule 5 is ~D ulps in the exponent; the 2x-naive rule measures it.
    assert_twice_naive(phi, ref, naive_features(x, w, kernel, None, fit, np.float32), kernel)


def test_features_estimate_the_softmax_kernel():
    # phi(x).phi(y) = (1/m) sum_f Z_f(x, y) estimates exp(scale x.y) without bias. With iid
    # rows the Z_f are independent, so the mean over pairs of the estimate has standard
    # error std_f(mean-over-pairs Z_f) / sqrt(m); docs/numerics.md rule 6: 5 standard errors.
    x, y = rand((10, D), 63, NORM), rand((12, D), 64, NORM)
    m = 4096
    w = favor.Projection.draw(m, D, kind="iid", seed=1)
    px, py = favor.features(x, projection=w), favor.features(y, projection=w)
    z = m * np.einsum("if,jf->f", px.astype(np.float64), py.astype(np.float64)) / (10 * 12)
    exact = np.exp((x.astype(np.float64) @ y.T) / math.sqrt(D)).mean()
    assert z.mean() == pytest.approx((px @ py.T).mean(), rel=1e-5)
    assert abs(z.mean() - exact) <= 5 * z.std(ddof=1) / math.sqrt(m)


# ---------------------------------------------------------------- fits

@pytest.mark.parametrize("kernel", ADAPTED)
def test_fit_kernel_per_batch_and_head(kernel):
    q, k = rand((2, 3, 25, 5), 71, 2.0), rand((2, 3, 30, 5), 72, 2.0)
    fit = favor.fit_kernel(kernel, q, k)
    assert isinstance(fit, favor.KernelFit)
    assert (fit.heads, fit.d, fit.a.shape, fit.basis.shape) == (6, 5, (6, 5), (6, 5, 5))
    assert np.all(fit.a < 0.125)
    x64 = q.astype(np.float64) / 5 ** 0.25  # x = q sqrt(scale), scale = 1/sqrt(D)
    y64 = k.astype(np.float64) / 5 ** 0.25
    for b in range(2):
        for h in range(3):
            e = b * 3 + h
            # each head's fit is that head's alone
            alone = favor.fit_kernel(kernel, q[b, h], k[b, h])
            assert alone.heads == 1
            np.testing.assert_allclose(alone.a[0], fit.a[e], rtol=1e-12, atol=1e-15)
            x, y = x64[b, h], y64[b, h]
            mx, my = x.mean(0), y.mean(0)
            if kernel == "favorpp":
                # rho = mean over pairs |x_i + y_j|^2 / d (estimators.hpp), A = optimal_a(rho)
                rho = (np.mean(np.sum(x * x, 1)) + np.mean(np.sum(y * y, 1)) + 2 * mx @ my) / 5
                np.testing.assert_allclose(fit.a[e], favor.optimal_a(rho), rtol=1e-12)
                assert np.array_equal(fit.basis[e], np.eye(5))
            else:
                # FAVOR#: column l of the basis is an eigenvector of
                # P = mean x x^T + mean y y^T + mx my^T + my mx^T with eigenvalue s_l, and
                # A_l = optimal_a(s_l).
                p = x.T @ x / len(x) + y.T @ y / len(y) + np.outer(mx, my) + np.outer(my, mx)
                basis = fit.basis[e]
                np.testing.assert_allclose(basis.T @ basis, np.eye(5), atol=1e-12)
                s = np.einsum("tl,tu,ul->l", basis, p, basis)
                np.testing.assert_allclose(p @ basis, basis * s, atol=1e-10)
                np.testing.assert_allclose(fit.a[e], [favor.optimal_a(max(0.0, t)) for t in s],
                                           rtol=1e-9)


@pytest.mark.parametrize("kernel", ADAPTED)
def test_fit_kernel_leaves_masked_keys_out(kernel):
    q, k = rand((1, 2, 20, 4), 73, 2.0), rand((1, 2, 24, 4), 74, 2.0)
    keep = np.arange(24) % 3 != 0
    masked = favor.fit_kernel(kernel, q, k, key_mask=keep[None])
    removed = favor.fit_kernel(kernel, q, k[:, :, keep])
    np.testing.assert_allclose(masked.a, removed.a, rtol=1e-12)
    assert not np.allclose(favor.fit_kernel(kernel, q, k).a, masked.a, rtol=1e-6)
    scaled = favor.fit_kernel(kernel, q, k, scale=0.1)
    assert not np.allclose(scaled.a, favor.fit_kernel(kernel, q, k).a, rtol=1e-6)


def test_kernel_fit_constant_constructor_and_pickle():
    c = favor.KernelFit.constant(-0.07, 5)
    assert (c.heads, c.d) == (1, 5)
    assert np.array_equal(c.a, np.full((1, 5), -0.07))
    assert np.array_equal(c.basis, np.eye(5)[None])
    fit = favor.fit_kernel("favorsharp", rand((2, 2, 10, 5), 75), rand((2, 2, 10, 5), 76))
    again = favor.KernelFit(fit.a, fit.basis)
    assert np.array_equal(again.a, fit.a) and np.array_equal(again.basis, fit.basis)
    back = pickle.loads(pickle.dumps(fit))
    assert (back.heads, back.d) == (fit.heads, fit.d)
    assert np.array_equal(back.a, fit.a) and np.array_equal(back.basis, fit.basis)
    # a and basis are copies: writing them does not change the fit
    a = fit.a
    a[:] = 0
    assert not np.array_equal(fit.a, a)


def test_optimal_a_closed_form():
    # estimators.hpp: A* = (1 - 2 rho - sqrt((2 rho + 1)^2 + 8 rho)) / 16, <= 0 for rho >= 0.
    for rho in [0.0, 1e-3, 0.5, 1.0, 3.7, 100.0]:
        want = (1 - 2 * rho - math.sqrt((2 * rho + 1) ** 2 + 8 * rho)) / 16
        assert favor.optimal_a(rho) == pytest.approx(want, rel=1e-14, abs=1e-300)
        assert favor.optimal_a(rho) <= 0


# ---------------------------------------------------------------- projections

def test_projection_draw():
    w = favor.Projection.draw(40, 16, seed=3)
    assert (w.m, w.d, w.kind, w.norms, w.seed, w.imported) == (40, 16, "orthogonal", "chi", 3,
                                                              False)
    mat = w.matrix
    assert mat.shape == (40, 16) and mat.dtype == np.float32
    assert np.array_equal(mat, favor.Projection.draw(40, 16, seed=3).matrix)  # deterministic
    assert not np.array_equal(mat, favor.Projection.draw(40, 16, seed=4).matrix)
    # Orthogonal blocks: rows of each d x d block are orthogonal (float32 rounding of the
    # entries: |w_i.w_j| <= ~d 2^-24 |w_i| |w_j|; bound 8 d 2^-24).
    blk = mat[:16].astype(np.float64)
    norms = np.linalg.norm(blk, axis=1)
    cos = (blk @ blk.T) / np.outer(norms, norms)
    assert np.max(np.abs(cos - np.eye(16))) <= 8 * 16 * 2.0 ** -24
    # fixed norms: every row has norm sqrt(d) (to float32 rounding)
    fixed = favor.Projection.draw(40, 16, norms="fixed", seed=3).matrix.astype(np.float64)
    np.testing.assert_allclose(np.linalg.norm(fixed, axis=1), 4.0, rtol=16 * 2.0 ** -24)


def test_projection_redraw():
    w = favor.Projection.draw(12, 6, kind="radial", norms="quantile", seed=5)
    r = w.redraw(9)
    assert (r.kind, r.norms, r.seed, r.m, r.d) == ("radial", "quantile", 9, 12, 6)
    assert np.array_equal(r.matrix, favor.Projection.draw(12, 6, kind="radial",
                                                          norms="quantile", seed=9).matrix)
    assert np.array_equal(w.redraw(5).matrix, w.matrix)


def test_projection_from_matrix():
    values = rand((10, 4), 81, dtype=np.float64)
    w = favor.Projection.from_matrix(values)
    assert (w.m, w.d, w.imported) == (10, 4, True)
    assert np.array_equal(w.matrix, values.astype(np.float32))
    values[0, 0] = 99.0  # the projection owns a copy
    assert w.matrix[0, 0] != 99.0
    with pytest.raises(favor.Error, match="redraw"):
        w.redraw(1)
    # an imported matrix equal to a drawn one gives the same attention, bit for bit
    q, k, v, _ = problem(causal=False)
    drawn = favor.Projection.draw(M, D, seed=6)
    imported = favor.Projection.from_matrix(drawn.matrix)
    assert np.array_equal(favor.attention(q, k, v, projection=imported),
                          favor.attention(q, k, v, projection=drawn))


def test_projection_matrix_is_read_only_and_keeps_the_projection_alive():
    w = favor.Projection.draw(8, 4, seed=1)
    mat = w.matrix
    assert not mat.flags.writeable
    with pytest.raises(ValueError):
        mat[0, 0] = 1.0
    expected = mat.copy()
    del w
    import gc
    gc.collect()
    assert np.array_equal(mat, expected)


@pytest.mark.parametrize("make", [lambda: favor.Projection.draw(9, 5, kind="qmc", seed=77),
                                  lambda: favor.Projection.draw(9, 5, kind="simplex",
                                                                norms="fixed", seed=2),
                                  lambda: favor.Projection.from_matrix(rand((9, 5), 82))],
                         ids=["qmc", "simplex", "imported"])
def test_projection_pickle(make):
    w = make()
    back = pickle.loads(pickle.dumps(w))
    assert (back.m, back.d, back.kind, back.norms, back.seed, back.imported) == \
        (w.m, w.d, w.kind, w.norms, w.seed, w.imported)
    assert np.array_equal(back.matrix, w.matrix)


# ---------------------------------------------------------------- metrics and build info

@pytest.mark.parametrize("kernel", KERNELS)
def test_kernel_mse(kernel):
    x, y = rand((7, D), 91, NORM), rand((9, D), 92, NORM)
    w = favor.Projection.draw(16, D, seed=12)
    fit = favor.fit_kernel(kernel, x, y) if kernel in ADAPTED else None
    got = favor.kernel_mse(x, y, kernel=kernel, projection=w, fit=fit)
    px = favor.reference.features(x, w, kernel=kernel, fit=fit)
    py = favor.reference.features(y, w, kernel=kernel, fit=fit)
    exact = np.exp((x.astype(np.float64) @ y.T.astype(np.float64)) / math.sqrt(D))
    want = np.mean((px @ py.T - exact) ** 2)
    # both in double from the same float32 rows: agreement to double rounding of the
    # O(F) sums, relative to the squared estimates (not the MSE, which can be tiny).
    assert abs(got - want) <= 1e-12 * np.mean(exact ** 2) + 1e-12 * want
    assert favor.kernel_mse(x[None, None], y[None, None], kernel=kernel, projection=w,
                            fit=fit) == got  # [1, 1, N, D] is [N, D]


def test_relative_frobenius_error():
    a, e = rand((2, 3, 10, 4), 93), rand((2, 3, 10, 4), 94)
    want = np.linalg.norm((a.astype(np.float64) - e).ravel()) / np.linalg.norm(
        e.astype(np.float64).ravel())
    assert favor.relative_frobenius_error(a, e) == pytest.approx(want, rel=1e-13)
    assert favor.relative_frobenius_error(e, e) == 0.0
    assert favor.relative_frobenius_error(a[0, 0], e[0, 0]) == pytest.approx(
        rel_err(a[0, 0], e[0, 0]), rel=1e-13)


def test_build_info_and_python_m_favor():
    info = favor.build_info()
    for word in ("simd", "blas", "threads"):
        assert word in info
    assert favor.__version__ in info
    tiles = favor.kernel_info()
    assert tiles["row_tile"] >= 1 and tiles["causal_chunk"] >= 1
    run = subprocess.run([sys.executable, "-m", "favor"], capture_output=True, text=True,
                         timeout=60, check=True)
    for word in ("simd", "blas", "threads", "row_tile", "causal_chunk"):
        assert word in run.stdout


def test_num_threads(single_thread):
    assert favor.num_threads() == 1
    favor.set_num_threads(2)
    assert favor.num_threads() == 2


def test_default_projection_is_drawn_once_per_kind_d_m_seed():
    """The numpy API draws a projection once per (kind, D, m, norms, seed) and shares it:
    calls with the default projection do not redraw it (docs/python.md, "The default
    projection"); other arguments give other draws."""
    a = favor.make_projection(64)
    assert a is favor.make_projection(64, "orthogonal", features=256, norms="chi", seed=0)
    assert a.m == 256 and a.d == 64
    assert favor.make_projection(64, seed=1) is not a
    assert favor.make_projection(32) is not a
    assert not a.matrix.flags.writeable  # shared, so it cannot be changed in place
    fresh = favor.Projection.draw(256, 64, kind="orthogonal", norms="chi", seed=0)
    assert np.array_equal(a.matrix, fresh.matrix)
