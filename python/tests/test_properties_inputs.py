"""Property tests (Hypothesis) of what the numpy and torch APIs accept: array layouts and
dtypes (a strided view, a float64 or float16 array, torch tensors: the same numbers give
the same bits), finite outputs for finite inputs at large norms, and favor.Error (a
ValueError naming the argument) for bad dtypes, non-finite values and mismatched shapes,
never a crash or a silent NaN. Profile: conftest.py ('favor': derandomized, 50 examples
per test, 25 where marked FEW, no deadline, no database).
"""
import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import favor
from property_helpers import (RANDOM_KERNELS, U32, problems, projections, scale_of,
                              visibility)

FEW = settings(max_examples=max(1, settings.default.max_examples // 2))
LAYOUTS = ("contiguous", "steps", "transposed", "fortran", "negative", "float64", "big-endian",
           "broadcast")


def layout(x, kind):
    """x (float32 [B, H, N, X]) in another memory layout holding the same values
    ('broadcast' is made by the test: it changes the values)."""
    if kind == "steps":
        big = np.zeros(x.shape[:2] + (2 * x.shape[2], 3 * x.shape[3]), dtype=np.float32)
        big[:, :, ::2, ::3] = x
        return big[:, :, ::2, ::3]
    if kind == "transposed":
        return np.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    if kind == "fortran":
        return np.asfortranarray(x)
    if kind == "negative":
        return np.ascontiguousarray(x[:, :, ::-1])[:, :, ::-1]
    if kind == "float64":
        return x.astype(np.float64)
    if kind == "big-endian":
        return x.astype(">f4")
    return x


def calls(p, w, kernel):
    """Every forward entry point on problem p: name -> result (features: the array, or the
    message of the favor.Error it raises when a feature overflows float32)."""
    opts = dict(causal=p["causal"], scale=p["scale"], key_mask=p["key_mask"])
    try:
        phi = favor.features(p["q"], projection=w, kernel=kernel, scale=p["scale"])
    except favor.Error as e:
        phi = str(e)
    return {"favor": favor.attention(p["q"], p["k"], p["v"], projection=w, kernel=kernel,
                                     **opts),
            "exact": favor.exact_attention(p["q"], p["k"], p["v"], **opts),
            "features": phi}


def same(a, b):
    return a == b if isinstance(a, str) or isinstance(b, str) else np.array_equal(a, b)


@given(st.data())
def test_layouts_and_conversions_give_the_same_bits(data):
    # Tiles are gathered into contiguous float32 buffers and conversions are exact, so any
    # layout of the same float32 values computes the same numbers in the same order.
    p = data.draw(problems(max_norm=4.0))
    w = data.draw(projections(p["q"].shape[-1]))
    kernel = data.draw(st.sampled_from(("positive", "trig", "hyperbolic")))
    changed = dict(p)
    for name in ("q", "k", "v"):
        kind = data.draw(st.sampled_from(LAYOUTS), label=f"layout of {name}")
        if kind == "broadcast":  # every row of this argument equal: a stride-0 view
            p[name] = np.ascontiguousarray(np.broadcast_to(p[name][:, :, :1], p[name].shape))
            changed[name] = np.broadcast_to(p[name][:, :, :1], p[name].shape)
        else:
            changed[name] = layout(p[name], kind)
    if p["key_mask"] is not None:
        kind = data.draw(st.sampled_from(["uint8", "int64x7", "steps", "fortran"]))
        m = p["key_mask"]
        wide = np.zeros((m.shape[0], 2 * m.shape[1]), dtype=bool)
        wide[:, ::2] = m
        changed["key_mask"] = {"uint8": m.astype(np.uint8), "int64x7": m.astype(np.int64) * 7,
                               "steps": wide[:, ::2], "fortran": np.asfortranarray(m)}[kind]
    want = calls(p, w, kernel)
    got = calls(changed, w, kernel)
    for name in want:
        assert same(got[name], want[name]), name


@FEW
@given(problems(max_norm=4.0), st.sampled_from(["float64", "float16"]), st.integers(0, 99))
def test_other_float_dtypes_are_their_float32_values(p, dtype, seed):
    # float64 (not float32-representable values) and float16 are converted once to float32
    # (round to nearest): the call equals the call on that float32 array.
    rng = np.random.default_rng(seed)
    w = favor.Projection.draw(16, p["q"].shape[-1], seed=seed)
    if dtype == "float64":
        wide = {n: p[n].astype(np.float64) * (1 + 1e-9 * rng.standard_normal(p[n].shape))
                for n in "qkv"}
    else:
        wide = {n: p[n].astype(np.float16) for n in "qkv"}
    narrow = {n: wide[n].astype(np.float32) for n in "qkv"}
    for kernel in ("positive", "trig"):
        a, b = calls(dict(p, **wide), w, kernel), calls(dict(p, **narrow), w, kernel)
        for name in a:
            assert same(a[name], b[name]), (dtype, kernel, name)


@st.composite
def large_problems(draw):
    """Norms up to 1e3 for q and k (docs/numerics.md: finite and inside the hull of the
    values up to 1e3), values up to 1e30."""
    p = draw(problems(max_norm=1.0, max_n=12, max_d=8))
    qn, kn = (draw(st.sampled_from([1e-3, 1.0, 30.0, 300.0, 1e3])) for _ in range(2))
    p["q"] = (p["q"] * qn).astype(np.float32)
    p["k"] = (p["k"] * kn).astype(np.float32)
    p["v"] = (p["v"] * draw(st.sampled_from([1.0, 1e10, 1e30]))).astype(np.float32)
    return p


@given(large_problems(), st.data())
def test_outputs_are_finite_and_inside_the_values(p, data):
    w = data.draw(projections(p["q"].shape[-1]))
    kernel = data.draw(st.sampled_from(RANDOM_KERNELS))
    fit = -0.1 if kernel == "favorpp" else None
    b, h, nq, _ = p["q"].shape
    vis = visibility(b, nq, p["k"].shape[2], p["causal"], p["key_mask"])
    v = p["v"].astype(np.float64)
    # per query row, the range of the values it can see (every channel)
    big = np.where(vis[:, None, :, :, None], v[:, :, None], -np.inf).max(axis=3)
    small = np.where(vis[:, None, :, :, None], v[:, :, None], np.inf).min(axis=3)
    slack = 64 * U32 * np.abs(v).max(initial=0) * (p["k"].shape[2] + 2 * w.m)
    none = ~vis.any(axis=2)                                       # [B, Nq]
    for name in ("favor", "exact"):
        if name == "favor":
            y, _, zero_rows = favor.attention(
                p["q"], p["k"], p["v"], projection=w, kernel=kernel, fit=fit,
                causal=p["causal"], scale=p["scale"], key_mask=p["key_mask"], full_output=True)
            if kernel != "trig":  # positive features: only rows without a key are zeros
                assert zero_rows == none.sum() * h, f"{kernel}: {zero_rows} zero rows"
        else:
            y = favor.exact_attention(p["q"], p["k"], p["v"], causal=p["causal"],
                                      scale=p["scale"], key_mask=p["key_mask"])
        assert np.all(np.isfinite(y)), name
        assert np.all(y[np.broadcast_to(none[:, None, :, None], y.shape)] == 0), name
        if name == "exact" or kernel != "trig":  # convex combinations of the values
            inside = (y >= small - slack) & (y <= big + slack) | ~np.isfinite(big)
            assert np.all(inside), f"{name} {kernel}: outside the range of the visible values"


EXPONENTS = (0, 10, 19, 20, 30, 38)


@given(problems(max_n=8, max_d=4, max_norm=1.0), st.sampled_from(EXPONENTS),
       st.sampled_from(EXPONENTS), st.data())
def test_exact_attention_is_finite_at_any_finite_magnitude(p, eq, ev, data):
    # q, k entries up to 1e38 (logits far beyond float32) and values up to 3e38 (sums beyond
    # float32): finite outputs, inside the values. Inputs that could overflow float32 take
    # the double path whatever `accumulate` says (src/attention.cpp): f32 and f64 then
    # agree bit for bit (before, f32 gave NaN from inf - inf, or inf).
    def scaled(x, e):  # x 10^e, clipped into float32's finite range
        return np.clip(x.astype(np.float64) * 10.0**e, -3e38, 3e38).astype(np.float32)

    q, k = scaled(p["q"], eq), scaled(p["k"], data.draw(st.sampled_from(EXPONENTS), label="ek"))
    v = scaled(p["v"], ev)
    opts = dict(causal=p["causal"], scale=p["scale"], key_mask=p["key_mask"])
    y = favor.exact_attention(q, k, v, **opts)
    y64 = favor.exact_attention(q, k, v, accumulate="f64", **opts)
    assert np.all(np.isfinite(y)) and np.all(np.isfinite(y64))
    assert np.all(np.abs(y) <= np.abs(v).max(initial=0) * (1 + 1e-6))
    # the library's rule, per head: scale |q|, scale |q| |k| or Nk max|v| above 1e38
    qn = scale_of(p) * np.linalg.norm(q.astype(np.float64), axis=-1).max(axis=-1)
    kn = np.linalg.norm(k.astype(np.float64), axis=-1).max(axis=-1)
    vn = v.shape[2] * np.abs(v.astype(np.float64)).max(axis=(2, 3))
    promoted = bool(np.any((qn > 1e38) | (qn * kn > 1e38) | (vn > 1e38)))
    event("double path" if promoted else "float path")
    if promoted:
        assert np.array_equal(y, y64)
    else:
        np.testing.assert_allclose(y, y64, rtol=1e-4, atol=1e-6 * np.abs(v).max(initial=0))


BAD_DTYPES = (np.int8, np.int32, np.int64, np.uint8, np.uint16, np.bool_, np.complex64,
              np.complex128, np.object_, np.str_)


def raises_value_error(call, name):
    with pytest.raises(ValueError) as info:  # favor.Error is a ValueError
        call()
    assert isinstance(info.value, favor.Error), type(info.value)
    assert name in str(info.value), f"{name!r} not named in: {info.value}"


def entry_points(p, w, dy):
    """Every entry point of the numpy API that reads q, k and v (dy where needed)."""
    return [
        lambda a: favor.attention(a["q"], a["k"], a["v"], projection=w),
        lambda a: favor.attention(a["q"], a["k"], a["v"], projection=w, causal=True)
        if a["q"].shape == a["k"].shape else favor.exact_attention(a["q"], a["k"], a["v"]),
        lambda a: favor.exact_attention(a["q"], a["k"], a["v"], accumulate="f64"),
        lambda a: favor.attention_backward(a["q"], a["k"], a["v"], dy, projection=w),
        lambda a: favor.exact_attention_backward(a["q"], a["k"], a["v"], dy),
    ]


@FEW
@given(problems(causal=False, max_n=8, max_d=6), st.sampled_from("qkv"),
       st.sampled_from(BAD_DTYPES), st.booleans())
def test_bad_dtypes_raise(p, name, dtype, strided):
    w = favor.Projection.draw(8, p["q"].shape[-1], seed=1)
    dy = np.ones(p["q"].shape[:3] + p["v"].shape[3:], dtype=np.float32)
    x = p[name]
    bad = (x * 3).astype(dtype) if dtype not in (np.object_, np.str_) else x.astype(dtype)
    if strided:
        bad = bad.transpose(0, 2, 1, 3).copy().transpose(0, 2, 1, 3)
    for call in entry_points(p, w, dy):
        raises_value_error(lambda: call(dict(p, **{name: bad})), name)
    if name == "q":
        raises_value_error(lambda: favor.features(bad, projection=w), "x")


@FEW
@given(problems(causal=False, max_n=8, max_d=6), st.sampled_from("qkv"),
       st.sampled_from([np.nan, np.inf, -np.inf, 1e39, -1e300]), st.data())
def test_non_finite_values_raise(p, name, value, data):
    # NaN and +-Inf anywhere; float64 values beyond float32's range become Inf when
    # converted, and are refused the same way (never a silent Inf or NaN output).
    w = favor.Projection.draw(8, p["q"].shape[-1], seed=1)
    dy = np.ones(p["q"].shape[:3] + p["v"].shape[3:], dtype=np.float32)
    x = p[name].astype(np.float64 if abs(value) > 3.5e38 else np.float32)
    where = tuple(data.draw(st.integers(0, s - 1)) for s in x.shape)
    x[where] = value
    with np.errstate(over="ignore"):
        for call in entry_points(p, w, dy):
            raises_value_error(lambda: call(dict(p, **{name: x})), name)


@FEW
@given(problems(causal=False, max_n=8, max_d=6), st.sampled_from("qkv"), st.integers(0, 3),
       st.sampled_from([-1, 1]))
def test_mismatched_shapes_raise(p, name, axis, change):
    w = favor.Projection.draw(8, p["q"].shape[-1], seed=1)
    dy = np.ones(p["q"].shape[:3] + p["v"].shape[3:], dtype=np.float32)
    x = p[name]
    if (name, axis) in (("q", 2), ("v", 3)):  # Nq and Dv are free: change the rank instead
        bad = x[0]
    else:
        n = x.shape[axis] + change
        if n < 1:
            n = x.shape[axis] + 1
        bad = np.resize(x, x.shape[:axis] + (n,) + x.shape[axis + 1:])
    for call in entry_points(p, w, dy):
        with pytest.raises(ValueError):
            call(dict(p, **{name: bad}))


@FEW
@given(st.data())
def test_torch_equals_the_numpy_api(data):
    torch = pytest.importorskip("torch")
    import favor.torch as ft
    p = data.draw(problems(max_norm=4.0))
    w = data.draw(projections(p["q"].shape[-1]))
    kernel = data.draw(st.sampled_from(("positive", "trig", "hyperbolic")))
    dtype = data.draw(st.sampled_from([torch.float32, torch.float64]))
    t = {n: torch.from_numpy(p[n]).to(dtype) for n in "qkv"}
    if data.draw(st.booleans()):  # heads of a [B, N, H, D] tensor, as a projection gives
        t["q"] = t["q"].transpose(1, 2).contiguous().transpose(1, 2)
    pad = None if p["key_mask"] is None else torch.from_numpy(~p["key_mask"])
    for method in ("favor", "exact"):
        y = ft.attention(t["q"], t["k"], t["v"], causal=p["causal"], kernel=kernel,
                         projection=w, scale=p["scale"], key_padding_mask=pad, method=method)
        assert y.dtype == dtype
        want = favor.attention(p["q"], p["k"], p["v"], causal=p["causal"], kernel=kernel,
                               projection=w, scale=p["scale"], key_mask=p["key_mask"],
                               method=method)
        assert np.array_equal(y.to(torch.float32).numpy(), want), method
