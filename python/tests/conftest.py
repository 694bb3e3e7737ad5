"""Shared helpers of the numpy-API tests: seeded inputs, a naive numpy evaluation of the
formulas in any precision, and the tolerance rule of docs/numerics.md.

Tolerance rule (docs/numerics.md, "How tolerances are derived", 1): a float32 result's
relative Frobenius error against the double reference (same projection, same fit) must be
at most twice the error of a naive float32 evaluation of the same formula (materialised,
unstabilised: naive_attention(..., np.float32) below, the numpy twin of
src/reference/naive.hpp) plus 1e-6 (8 float32 ulps, for cases where the naive error
happens to be tiny). The rule scales itself with N, m, D and the norms.

Run: cd python/tests && PYTHONPATH=<build>/python FAVOR_CLI=<build>/tools/favor \
     python3 -m pytest -q
"""
import math
import os

import numpy as np
import pytest

import favor

# Hypothesis profiles of the property tests (test_properties*.py). 'favor' (the default):
# derandomized (a fixed seed: every run draws the same examples), 40 examples per test
# (tests may halve it), no deadline (timings vary on shared machines), no example database
# (nothing written to the source tree). FAVOR_HYPOTHESIS_PROFILE=long: 1000 random examples
# per test, for searching by hand. Other tests do not need hypothesis installed.
try:
    from hypothesis import HealthCheck, settings as _hypothesis_settings
except ImportError:  # pragma: no cover
    _hypothesis_settings = None
else:
    _hypothesis_settings.register_profile(
        "favor", derandomize=True, max_examples=50, deadline=None, database=None,
        print_blob=True, suppress_health_check=[HealthCheck.too_slow])
    _hypothesis_settings.register_profile(
        "long", derandomize=False, max_examples=1000, deadline=None, database=None,
        print_blob=True, suppress_health_check=[HealthCheck.too_slow])
    _hypothesis_settings.load_profile(os.environ.get("FAVOR_HYPOTHESIS_PROFILE", "favor"))


def _hypothesis_profile():
    if _hypothesis_settings is None:
        return "hypothesis: not installed (the property tests need python3-hypothesis)"
    s = _hypothesis_settings.default
    return (f"hypothesis profile {_hypothesis_settings._current_profile!r}: "
            f"derandomize={s.derandomize}, max_examples={s.max_examples}, "
            f"deadline={s.deadline}, database={s.database}")


def pytest_report_header(config):
    return _hypothesis_profile()


def pytest_terminal_summary(terminalreporter):
    # The header is hidden under -q (as CTest runs pytest): repeat the profile at the end
    # of runs that included the property tests.
    reports = [r for rs in terminalreporter.stats.values() for r in rs
               if "test_properties" in getattr(r, "nodeid", "")]
    if reports:
        terminalreporter.write_line(_hypothesis_profile())


def opcheck_tolerance(n, features):
    """atol and rtol for torch.library.opcheck of favor's ops on N tokens and F features.
    opcheck compares eager gradients with AOTDispatcher's: both run favor's float32 kernels,
    and the torch side of a formula may sum in another order (another SIMD width gives other
    bits), so each is within (N + F) 2^-24 of the exact value relative to its size, as any two
    float32 evaluations of one formula (docs/numerics.md, rule 4), and they differ by at most
    twice that. This holds for float64 parameters too (a decay gamma, a fit): their gradients
    come from float32 kernels, and opcheck's float64 default (1e-7) is below float32's own
    resolution (on AVX2 learned decay's gamma gradient differed by 1.5e-7 relative)."""
    tol = 2.0 * (n + features) * 2.0 ** -24
    return dict(atol=tol, rtol=tol)


KERNELS = ("positive", "trig", "hyperbolic", "favorpp", "favorsharp")
ADAPTED = ("favorpp", "favorsharp")
# 8 float32 ulps of slack (docs/numerics.md rule 1).
F32_SLACK = 1e-6


def rand(shape, seed, norm=None, dtype=np.float32):
    """Standard normal entries (seeded); with `norm`, every row (last axis) rescaled to
    that Euclidean norm."""
    x = np.random.default_rng(seed).standard_normal(shape)
    if norm is not None:
        x *= norm / np.linalg.norm(x, axis=-1, keepdims=True)
    return x.astype(dtype)


def rel_err(approx, exact):
    """|approx - exact|_F / |exact|_F in double."""
    a = np.asarray(approx, dtype=np.float64)
    e = np.asarray(exact, dtype=np.float64)
    return float(np.linalg.norm((a - e).ravel()) / np.linalg.norm(e.ravel()))


def as4(x):
    """[N, X] -> [1, 1, N, X]; [B, H, N, X] unchanged."""
    x = np.asarray(x)
    return x[None, None] if x.ndim == 2 else x


def default_scale(d, scale):
    return 1.0 / math.sqrt(d) if scale is None else scale


def head_map(w, kernel, fit, bh):
    """W (or the FAVOR++/FAVOR# effective projection), the per-feature log bias and the log
    of the constant factor for head bh, in double, from docs/math.md s.2 and the KernelFit
    layout of estimators.hpp (entry bh, or 0 for a shared fit; column l of basis is the
    direction of A_l)."""
    W = np.asarray(w.matrix, dtype=np.float64)
    m = W.shape[0]
    log_c = -0.5 * math.log(2 * m if kernel == "hyperbolic" else m)
    bias = np.zeros(m)
    if kernel in ADAPTED:
        g = 0 if fit.heads == 1 else bh
        a, basis = fit.a[g], fit.basis[g]
        log_c += 0.25 * float(np.sum(np.log(1.0 - 4.0 * a)))
        bias = (W * W) @ a
        # W_eff[f, t] = sum_l basis[t, l] sqrt(1 - 4 a_l) W[f, l]
        W = (W * np.sqrt(1.0 - 4.0 * a)) @ basis.T
    return W, bias, log_c


def naive_head_features(x, w, kernel, scale, fit, bh, dtype):
    """phi(x) for one head x [N, D], every constant kept, evaluated in `dtype`."""
    W, bias, log_c = head_map(w, kernel, fit, bh)
    xs = dtype(math.sqrt(scale)) * np.asarray(x).astype(dtype)
    norm2 = np.sum(xs * xs, axis=-1, keepdims=True)
    a = xs @ W.T.astype(dtype) + bias.astype(dtype)
    c = np.exp(dtype(log_c))
    if kernel == "trig":
        e = c * np.exp(norm2 / 2)
        return np.concatenate([e * np.sin(a), e * np.cos(a)], axis=-1)
    if kernel == "hyperbolic":
        e = c * np.exp(-norm2 / 2)
        return np.concatenate([e * np.exp(a), e * np.exp(-a)], axis=-1)
    return c * np.exp(a - norm2 / 2)


def naive_features(x, w, kernel="positive", scale=None, fit=None, dtype=np.float32):
    """[B, H, N, D] (or [N, D]) -> [..., F] in `dtype`."""
    x4 = as4(x)
    B, H = x4.shape[:2]
    scale = default_scale(x4.shape[3], scale)
    out = np.stack([np.stack([naive_head_features(x4[b, h], w, kernel, scale, fit, b * H + h,
                                                  dtype) for h in range(H)]) for b in range(B)])
    return out[0, 0] if np.ndim(x) == 2 else out


def attention_fit(kernel, q, k, causal, scale, key_mask, fit):
    """The fit an attention call uses: the given one (a float A becomes KernelFit.constant)
    or, bidirectionally, the library's fit to q and k (as favor.attention does)."""
    if kernel not in ADAPTED:
        return None
    if isinstance(fit, float):
        return favor.KernelFit.constant(fit, q.shape[-1])
    if fit is not None:
        return fit
    assert not causal
    return favor.fit_kernel(kernel, q, k, scale=scale, key_mask=key_mask)


def naive_attention(q, k, v, w, kernel="positive", causal=False, scale=None, key_mask=None,
                    fit=None, dtype=np.float32):
    """Materialised FAVOR attention A = phi(Q) phi(K)^T (causal/mask applied), y = A V / A 1,
    rows with a denominator not > 0 (or not finite) are zeros; evaluated in `dtype`."""
    q4, k4, v4 = as4(q), as4(k), as4(v)
    B, H, nq, d = q4.shape
    fit = attention_fit(kernel, q, k, causal, scale, key_mask, fit)
    scale = default_scale(d, scale)
    mask = None if key_mask is None else np.asarray(key_mask).reshape(B, -1) != 0
    out = np.zeros((B, H, nq, v4.shape[3]), dtype=dtype)
    for b in range(B):
        for h in range(H):
            pq = naive_head_features(q4[b, h], w, kernel, scale, fit, b * H + h, dtype)
            pk = naive_head_features(k4[b, h], w, kernel, scale, fit, b * H + h, dtype)
            a = pq @ pk.T
            if causal:
                a = np.tril(a)
            if mask is not None:
                a = np.where(mask[b][None, :], a, dtype(0))
            num = a @ v4[b, h].astype(dtype)
            den = a.sum(axis=1)
            ok = (den > 0) & np.isfinite(den)
            with np.errstate(divide="ignore", invalid="ignore"):
                out[b, h] = np.where(ok[:, None], num / den[:, None], dtype(0))
    return out[0, 0] if np.ndim(q) == 2 else out


def naive_exact(q, k, v, causal=False, scale=None, key_mask=None, dtype=np.float32):
    """Naive softmax attention (scores materialised, max-subtracted) in `dtype`; rows with
    no visible key are zeros."""
    q4, k4, v4 = as4(q), as4(k), as4(v)
    B, H, nq, d = q4.shape
    nk = k4.shape[2]
    scale = default_scale(d, scale)
    visible = np.ones((B, nq, nk), dtype=bool)
    if causal:
        visible &= np.tril(np.ones((nq, nk), dtype=bool))[None]
    if key_mask is not None:
        visible &= (np.asarray(key_mask).reshape(B, nk) != 0)[:, None, :]
    out = np.zeros((B, H, nq, v4.shape[3]), dtype=dtype)
    for b in range(B):
        for h in range(H):
            s = dtype(scale) * (q4[b, h].astype(dtype) @ k4[b, h].astype(dtype).T)
            s = np.where(visible[b], s, -np.inf)
            top = s.max(axis=1, keepdims=True)
            any_key = np.isfinite(top)
            p = np.where(visible[b], np.exp(s - np.where(any_key, top, 0)), dtype(0))
            den = p.sum(axis=1, keepdims=True)
            with np.errstate(divide="ignore", invalid="ignore"):
                out[b, h] = np.where(any_key, (p @ v4[b, h].astype(dtype)) / den, dtype(0))
    return out[0, 0] if np.ndim(q) == 2 else out


def assert_twice_naive(fast, ref, naive, what=""):
    """docs/numerics.md rule 1: err(fast) <= 2 err(naive float32) + 1e-6."""
    err, naive_err = rel_err(fast, ref), rel_err(naive, ref)
    assert err <= 2.0 * naive_err + F32_SLACK, (
        f"{what}: error {err:.3g} vs the double reference exceeds twice the naive float32 "
        f"error {naive_err:.3g} + {F32_SLACK}")
    return err, naive_err


def calibration_fit(kernel, shape, seed, norm=None):
    """A FAVOR++/FAVOR# fit from calibration data (never the sequence itself: causal and
    streaming attention must not see future tokens), one entry per (batch, head)."""
    return favor.fit_kernel(kernel, rand(shape, seed, norm), rand(shape, seed + 1, norm))


@pytest.fixture
def single_thread():
    """favor.set_num_threads(1) for one test; the previous count (and whether the user had
    chosen it, which favor.torch reads) is restored afterwards."""
    from favor import _threads
    before, user_set = favor.num_threads(), _threads._user_set
    favor.set_num_threads(1)
    yield
    favor.set_num_threads(before)
    _threads._user_set = user_set


@pytest.fixture
def favor_cli():
    """The `favor` command-line tool (env FAVOR_CLI), or skip."""
    path = os.environ.get("FAVOR_CLI")
    if not path:
        pytest.skip("FAVOR_CLI is not set: point it at the built `favor` tool "
                    "(e.g. build/tools/favor) to compare the numpy API with the CLI")
    if not os.access(path, os.X_OK):
        pytest.skip(f"FAVOR_CLI={path} is not an executable file")
    return path
