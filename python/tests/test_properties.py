"""Property tests (Hypothesis) of the numpy API against float64 oracles, and the
invariances the formulas have.

Profile 'favor' (conftest.py): derandomized (fixed seed), 50 examples per test (25 where
marked FEW), no deadline, no example database; FAVOR_HYPOTHESIS_PROFILE=long runs 1000
random examples per test. Oracles and bounds: property_helpers.py (float32 rounding bounds,
derived there). Invariances tested are exact identities of the formulas, never of their
expectations:
- exact attention: adding one vector c to every key adds scale q_i.c to every logit of
  row i, which the softmax removes (not true of FAVOR: phi(k + c) multiplies feature f by
  exp(w_f.c'), a factor that depends on f);
- both: permuting keys with their values (and mask), masking a key = removing it
  (bidirectional), future keys never reach a causal row, v -> a v + b gives a y + b,
  (a q, a k, scale s / a^2) = (q, k, scale s), heads are independent; a Decoder gives the
  causal rows;
- FAVOR with a projection W: rotating q, k by R and W to W R, or permuting W's rows, keeps
  every w_f.x and |x|, hence every feature.
"""
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import favor
from property_helpers import (RANDOM_KERNELS, U32, exact_f64_bound, exact_oracle,
                              exact_reference, favor_reference, key_feature_spread,
                              log_features, one_head, problems, projections, scale_of,
                              threads)

FEW = settings(max_examples=max(1, settings.default.max_examples // 2))


def call_favor(p, w, kernel, fit=None, **over):
    args = dict(p, **over)
    return favor.attention(args["q"], args["k"], args["v"], causal=args["causal"],
                           scale=args["scale"], key_mask=args["key_mask"], projection=w,
                           kernel=kernel, fit=fit)


def call_exact(p, **over):
    args = dict(p, **over)
    return favor.exact_attention(args["q"], args["k"], args["v"], causal=args["causal"],
                                 scale=args["scale"], key_mask=args["key_mask"],
                                 accumulate=args.get("accumulate", "f32"))


def check_within(y, y_ref, bound, ok, what):
    y = np.asarray(y, dtype=np.float64)
    assert np.all(np.isfinite(y)), what
    assert np.all(y[~ok] == 0), f"{what}: rows without a defined value must be zeros"
    err = np.abs(y - y_ref)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert np.all(err <= bound), (f"{what}: |y - y_ref| = {err[worst]:.3g} > bound "
                                  f"{bound[worst]:.3g} at {worst}")


@st.composite
def kernel_and_fit(draw, p):
    kernel = draw(st.sampled_from(RANDOM_KERNELS + ("favorsharp",)))
    if kernel == "favorpp":
        return kernel, draw(st.sampled_from([-0.5, -0.1, 0.0, 0.1]))
    if kernel == "favorsharp":
        return kernel, favor.fit_kernel(kernel, p["q"], p["k"], scale=p["scale"])
    return kernel, None


# ---------------------------------------------------------------- against the oracles

@given(problems(max_norm=10.0), st.booleans())
def test_exact_equals_float64_softmax(p, rank2):
    if rank2:  # [N, D] arrays are one head: oracle on [1, 1, N, D], the call on [N, D]
        p = one_head(p, 0, 0, keep_rank=True)
    y_ref, wts, ok = exact_oracle(p)
    _, bound, _ = exact_reference(p)
    args = one_head(p, 0, 0) if rank2 else p
    y = call_exact(args)
    check_within(y[None, None] if rank2 else y, y_ref, bound, ok, "exact f32")
    assert np.array_equal(favor.attention(args["q"], args["k"], args["v"], method="exact",
                                          causal=p["causal"], scale=p["scale"],
                                          key_mask=args["key_mask"]), y)
    # f64 accumulation: the double result rounded once to float32 (u |y| + a trace)
    y64 = call_exact(args, accumulate="f64")
    check_within(y64[None, None] if rank2 else y64, y_ref, exact_f64_bound(p, y_ref, wts), ok,
                 "exact f64")


@given(st.data())
def test_favor_equals_float64_ratio_of_features(data):
    p = data.draw(problems(max_norm=8.0))
    w = data.draw(projections(p["q"].shape[-1]))
    assert np.all(np.isfinite(w.matrix)), "a drawn projection has a non-finite entry"
    kernel, fit = data.draw(kernel_and_fit(p))
    core_fit = favor.KernelFit.constant(fit, w.d) if isinstance(fit, float) else fit
    # outside this, dead key features may drop dominant terms: see
    # test_dead_key_features_keep_their_terms below (a known limitation)
    assume(key_feature_spread(p, w, kernel, core_fit) < 80)
    y = call_favor(p, w, kernel, fit)
    y_ref, bound, ok, ratio = favor_reference(p, w, kernel, core_fit)
    if kernel == "trig":
        # A denominator that cancels to ~0 (relative to sum |A_ij|) decides zero / not zero
        # by rounding: leave those rows out; the bound covers the others.
        clear = np.abs(ratio) > 1e-3
        y = np.where(clear[..., None], y, 0.0)
        y_ref, ok = np.where(clear[..., None], y_ref, 0.0), ok & clear
    check_within(y, y_ref, bound, ok, f"favor {kernel} m={w.m}")
    # favor.features is the same phi (constants included) the oracle used: compare one head
    if kernel in ("positive", "hyperbolic", "trig") and p["q"].shape[-1] <= 8:
        lq, sq, size = log_features(p["q"][0, 0], w, kernel, scale_of(p), None, 0)
        if np.all(lq < 80):
            phi = favor.features(p["q"][0, 0], projection=w, kernel=kernel, scale=p["scale"])
            # each exponent (and a trig argument) is off by (D + 4) u size, as in favor_bound;
            # trig's sin/cos cross zero, so its error is relative to the row's amplitude;
            # features below float32's smallest normal may flush to 0
            mag = np.exp(lq)
            if kernel == "trig":
                mag = np.broadcast_to(mag.max(axis=1, keepdims=True), mag.shape)
            tol = U32 * (2 * (p["q"].shape[-1] + 4) * size[:, None] + 8) * mag + 2.0**-126
            err = np.abs(phi - sq * np.exp(lq))
            assert np.all(err <= tol), f"features: {np.max(err / tol):.3g} x the bound"


@pytest.mark.xfail(strict=True, reason="known limitation: key features stabilised by one "
                   "max over all features die (underflow) ~87 below it, even when a query "
                   "weights them most; needs a per-feature key max (reported in issue 14)")
@pytest.mark.parametrize("causal", [False, True])
def test_dead_key_features_keep_their_terms(causal):
    # Minimised from the oracle property at large norms. W rows +-3 e1 and 0.5 e2; keys
    # -r e1 (+ e2): feature 1's key log-features sit 6r below feature 2's, so for r >= 15
    # feature 1's key sum underflows and is dropped, while the query r e1 weights feature 1
    # by exp(6r): its term is as large as feature 2's. The float64 ratio of features is the
    # same 0.42452 for every r; favor returns 0.4455 at r = 15, 20.
    w = favor.Projection.from_matrix(np.array([[3, 0], [-3, 0], [0, 0.5]], np.float32))
    for r in (5.0, 15.0, 20.0):
        p = dict(q=np.array([[[[r, 0]] * 2]], np.float32),
                 k=np.array([[[[-r, 0], [-r, 1]]]], np.float32),
                 v=np.array([[[[0.0], [1.0]]]], np.float32), key_mask=None, causal=causal,
                 scale=1.0)
        y_ref, bound, ok, _ = favor_reference(p, w, "positive")
        check_within(call_favor(p, w, "positive"), y_ref, bound, ok, f"r = {r}")


# ---------------------------------------------------------------- invariances

def both(p, w, kernel):
    return {"exact": call_exact(p), "favor": call_favor(p, w, kernel)}


@FEW
@given(st.data())
def test_key_permutation_and_mask_as_removal(data):
    p = data.draw(problems(causal=False))
    w = data.draw(projections(p["q"].shape[-1]))
    kernel = data.draw(st.sampled_from(("positive", "hyperbolic")))
    nk = p["k"].shape[2]
    perm = np.random.default_rng(data.draw(st.integers(0, 99))).permutation(nk)
    pp = dict(p, k=p["k"][:, :, perm], v=p["v"][:, :, perm],
              key_mask=None if p["key_mask"] is None else p["key_mask"][:, perm])
    refs = {"exact": exact_reference(p), "favor": favor_reference(p, w, kernel)}
    y, y_perm = both(p, w, kernel), both(pp, w, kernel)
    # masking keys equals removing them (one batch entry: B = 1)
    cut = None
    if p["key_mask"] is not None and p["q"].shape[0] == 1 and p["key_mask"].any():
        keep = p["key_mask"][0]
        cut = both(dict(p, k=p["k"][:, :, keep], v=p["v"][:, :, keep], key_mask=None), w,
                   kernel)
    for name, (_, bound, ok) in ((n, r[:3]) for n, r in refs.items()):
        # each side within the bound of the same value: the two within twice the bound
        check_within(y_perm[name], y[name], 2 * bound, ok, name + " perm")
        if cut is not None:
            check_within(cut[name], y[name], 2 * bound, ok, name + " mask = removal")


@FEW
@given(st.data())
def test_future_keys_do_not_reach_causal_rows(data):
    p = data.draw(problems(causal=True, max_norm=8.0))
    w = data.draw(projections(p["q"].shape[-1]))
    kernel, fit = data.draw(kernel_and_fit(p))
    if kernel == "favorsharp":
        fit = favor.fit_kernel(kernel, p["q"], p["q"])  # fixed calibration fit
    n = p["k"].shape[2]
    t = data.draw(st.integers(0, n - 1))
    big = data.draw(st.sampled_from([1.0, 10.0, 100.0]))   # future keys may dominate
    rng = np.random.default_rng(t)
    k2, v2 = p["k"].copy(), p["v"].copy()
    k2[:, :, t + 1:] = (rng.standard_normal(k2[:, :, t + 1:].shape) * big).astype(np.float32)
    v2[:, :, t + 1:] = (rng.standard_normal(v2[:, :, t + 1:].shape) * big).astype(np.float32)
    mask2 = None if p["key_mask"] is None else p["key_mask"].copy()
    if mask2 is not None:
        mask2[:, t + 1:] = rng.random(mask2[:, t + 1:].shape) < 0.5
    p2 = dict(p, k=k2, v=v2, key_mask=mask2)
    for y, y2 in [(call_favor(p, w, kernel, fit), call_favor(p2, w, kernel, fit)),
                  (call_exact(p), call_exact(p2))]:
        assert np.array_equal(y[:, :, :t + 1], y2[:, :, :t + 1])
    # and the prefix alone gives the same rows (a causal row reads keys <= i only)
    pre = {n_: (x[:, :, :t + 1] if n_ in "qkv" else x) for n_, x in p.items()}
    if p["key_mask"] is not None:
        pre["key_mask"] = p["key_mask"][:, :t + 1]
    _, bound, ok, _ = favor_reference(pre, w, kernel, fit)
    check_within(call_favor(pre, w, kernel, fit),
                 call_favor(p, w, kernel, fit)[:, :, :t + 1].astype(np.float64),
                 2 * bound, ok, "causal prefix")


@FEW
@given(problems(max_norm=6.0), st.floats(0.0, 6.0), st.integers(0, 2**32 - 1))
def test_exact_is_invariant_to_a_common_key_shift(p, shift_norm, seed):
    d = p["q"].shape[-1]
    c = np.random.default_rng(seed).standard_normal(d)
    c *= shift_norm / max(np.linalg.norm(c), 1e-30)
    shifted = dict(p, k=(p["k"] + c.astype(np.float32)).astype(np.float32))
    y_ref, b1, ok = exact_reference(p)
    _, b2, _ = exact_reference(shifted)
    # k + c is rounded to float32, which moves logits by up to u |q| |k + c| scale: within
    # the bound of the shifted problem, once for the rounding and once for the call
    check_within(call_exact(shifted), y_ref, b1 + 2 * b2, ok, "exact key shift")


@FEW
@given(st.data())
def test_equivariances_of_values_and_scale(data):
    p = data.draw(problems(max_norm=6.0))
    w = data.draw(projections(p["q"].shape[-1]))
    kernel = data.draw(st.sampled_from(("positive", "hyperbolic", "trig")))
    # (2^e q, 2^e k, scale s 4^-e) = (q, k, s): powers of two scale float32 exactly and
    # sqrt(s 4^-e) = sqrt(s) 2^-e, so the library computes the same numbers
    e = data.draw(st.integers(-3, 3))
    s = 1.0 / np.sqrt(p["q"].shape[-1]) if p["scale"] is None else p["scale"]
    pe = dict(p, q=p["q"] * np.float32(2.0**e), k=p["k"] * np.float32(2.0**e),
              scale=s * 4.0**-e)
    for name, y in both(dict(p, scale=s), w, kernel).items():
        y_e = both(pe, w, kernel)[name]
        assert np.array_equal(y, y_e), f"{name}: scale equivariance"
    # v -> a v + b: every defined row is a normalised combination of the values
    a = data.draw(st.sampled_from([-2.0, 0.5, 3.0]))
    b = np.asarray(data.draw(st.lists(st.floats(-4, 4), min_size=p["v"].shape[-1],
                                      max_size=p["v"].shape[-1])), dtype=np.float32)
    pv = dict(p, v=(a * p["v"] + b).astype(np.float32))
    # (the oracle of p mapped by a y + b; the bound of both problems, and the rounding of
    # a v + b itself)
    refs = {"exact": (exact_reference(p), exact_reference(pv))}
    if kernel != "trig":  # trig rows may flip to zeros (denominator <= 0) by rounding
        refs["favor"] = (favor_reference(p, w, kernel)[:3], favor_reference(pv, w, kernel)[:3])
    got = both(pv, w, kernel)
    for name, ((y_ref, bound, ok), (_, bound_v, _)) in refs.items():
        want = np.where(ok[..., None], a * y_ref + b, 0.0)
        check_within(got[name], want, abs(a) * bound + bound_v + 4 * U32 * np.abs(want), ok,
                     name + " a v + b")


@FEW
@given(st.data())
def test_favor_rotation_and_feature_order(data):
    p = data.draw(problems(max_norm=6.0))
    d = p["q"].shape[-1]
    w = data.draw(projections(d))
    kernel, fit = data.draw(kernel_and_fit(p))
    assume(kernel != "favorsharp")  # its fitted basis is not rotated with the inputs
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    r, _ = np.linalg.qr(rng.standard_normal((d, d)))
    wm = np.asarray(w.matrix, dtype=np.float64)
    # float32 rounding of q R, k R and W R moves each w_f.x by ~ (D + 2) u |w_f| |x|: the
    # same terms as the bound, so the rotated call is compared at twice the bound
    pr = dict(p, q=(p["q"] @ r).astype(np.float32), k=(p["k"] @ r).astype(np.float32))
    wr = favor.Projection.from_matrix((wm @ r).astype(np.float32))
    _, bound, ok, ratio = favor_reference(p, w, kernel, fit)
    y = call_favor(p, w, kernel, fit)
    if kernel == "trig":
        assume(np.all(np.abs(ratio)[ok] > 1e-3))
    check_within(call_favor(pr, wr, kernel, fit), y, 3 * bound, ok, "rotation")
    # permuting the rows of W permutes the features: the sums over f are the same
    perm = rng.permutation(w.m)
    wp = favor.Projection.from_matrix(np.asarray(w.matrix)[perm])
    check_within(call_favor(p, wp, kernel, fit), y, 2 * bound, ok, "feature order")


@FEW
@given(st.data())
def test_heads_are_independent(data):
    # One thread: every head is one task whatever the batch, so head (b, h) alone is the
    # same bits. With more threads than heads a head is split into parts whose partial
    # sums merge in another order (cpu/schedule.hpp): equal within the rounding bound.
    p = data.draw(problems())
    w = data.draw(projections(p["q"].shape[-1]))
    kernel = data.draw(st.sampled_from(("positive", "hyperbolic")))
    b, h = (data.draw(st.integers(0, p["q"].shape[i] - 1)) for i in (0, 1))
    one = one_head(p, b, h)
    with threads(1):
        for name, y in both(p, w, kernel).items():
            y1 = call_exact(one) if name == "exact" else call_favor(one, w, kernel)
            assert np.array_equal(y1, y[b, h]), f"{name}: head ({b}, {h}) alone differs"
    _, bound, ok, _ = favor_reference(p, w, kernel)
    check_within(call_favor(one, w, kernel), call_favor(p, w, kernel)[b, h], 2 * bound[b, h],
                 ok[b, h], "favor head alone, default threads")


@FEW
@given(st.data())
def test_decoder_rows_equal_the_causal_oracle(data):
    # After appending tokens 0..i (in chunks of any sizes), a query gives row i of causal
    # attention (the decoder has no key mask); its state does not grow with the position.
    p = data.draw(problems(causal=True, max_norm=6.0))
    p["key_mask"] = None
    b, h, n, _ = p["q"].shape
    w = data.draw(projections(p["q"].shape[-1]))
    kernel, fit = data.draw(kernel_and_fit(p))
    if kernel == "favorsharp":
        fit = favor.fit_kernel(kernel, p["k"], p["k"])  # calibration data, not the queries
    core_fit = favor.KernelFit.constant(fit, w.d) if isinstance(fit, float) else fit
    assume(key_feature_spread(p, w, kernel, core_fit) < 80)  # as in the oracle test
    dec = favor.Decoder(b, h, p["v"].shape[-1], w, kernel=kernel, scale=p["scale"], fit=fit)
    size, rows, ends, t = dec.state_bytes, [], [], 0
    while t < n:
        step = data.draw(st.integers(1, n - t), label="chunk")
        dec.append(p["k"][:, :, t:t + step], p["v"][:, :, t:t + step])
        t += step
        rows.append(dec.query(p["q"][:, :, t - 1:t]))
        ends.append(t - 1)
    assert dec.position == n and dec.state_bytes == size
    y_ref, bound, ok, ratio = (x[:, :, ends] for x in favor_reference(p, w, kernel, fit))
    y = np.concatenate(rows, axis=2)
    if kernel == "trig":
        clear = np.abs(ratio) > 1e-3
        y, y_ref, ok = (np.where(clear[..., None], y, 0.0), np.where(clear[..., None], y_ref, 0.0),
                        ok & clear)
    check_within(y, y_ref, bound, ok, f"decoder {kernel}")
