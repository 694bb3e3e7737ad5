"""Bad input to the numpy API raises favor.Error (a ValueError) whose message names the
argument, and nothing is half-written: the inputs are untouched and a Decoder whose
append or query failed keeps its state and position.
"""
import re

import numpy as np
import pytest

import favor
from conftest import rand

B, H, N, D, DV = 2, 3, 12, 8, 5


@pytest.fixture
def qkv():
    return (rand((B, H, N, D), 1), rand((B, H, N, D), 2), rand((B, H, N, DV), 3),
            rand((B, H, N, DV), 4))


def names(message, argument):
    """The message names `argument` as a word ("q:", "q [..]", "k, v", "key_mask: ...")."""
    return re.search(r"(?<![\w-])" + re.escape(argument) + r"(?![\w-])", message) is not None


def raises_naming(argument, call, *args, **kwargs):
    with pytest.raises(favor.Error) as info:
        call(*args, **kwargs)
    assert isinstance(info.value, ValueError)
    assert names(str(info.value), argument), f"{argument!r} not named in: {info.value}"
    return str(info.value)


def attention_calls(q, k, v, dy):
    """Every entry point that takes q, k, v (with dy where needed), as name -> call."""
    return {
        "attention": lambda q=q, k=k, v=v, **kw: favor.attention(q, k, v, features=8, **kw),
        "exact": lambda q=q, k=k, v=v, **kw: favor.exact_attention(q, k, v, **kw),
        "backward": lambda q=q, k=k, v=v, dy=dy, **kw: favor.attention_backward(
            q, k, v, dy, features=8, **kw),
        "exact_backward": lambda q=q, k=k, v=v, dy=dy, **kw: favor.exact_attention_backward(
            q, k, v, dy, **kw),
    }


# ---------------------------------------------------------------- shapes

def test_mismatched_shapes(qkv):
    q, k, v, dy = qkv
    for name, call in attention_calls(q, k, v, dy).items():
        raises_naming("k", call, k=k[..., :D - 1])                  # D of q vs k
        raises_naming("q", call, k=k[..., :D - 1])
        raises_naming("v", call, v=v[:, :, :N - 1])                 # Nk of k vs v
        raises_naming("k", call, k=k[:1], v=v[:1])                  # B
        raises_naming("q", call, k=k[:, :2], v=v[:, :2])            # H
        raises_naming("v", call, v=v[:1])
    # Dv: dy must have the output's shape
    raises_naming("dy", favor.attention_backward, q, k, v, dy[..., :DV - 1])
    raises_naming("dy", favor.exact_attention_backward, q, k, v, dy[:, :, :N - 1])
    raises_naming("dy", favor.attention_backward, q, k, v, dy[:1])


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_ranks(qkv, which):
    q, k, v, dy = qkv
    for name, call in attention_calls(q, k, v, dy).items():
        x = dict(q=q, k=k, v=v)[which]
        for bad in (x[0], x[0, 0, 0], x[None], np.float32(1.0)):    # rank 3, 1, 5, 0
            raises_naming(which, call, **{which: bad})
        # mixing 2-D and 4-D is refused too
        raises_naming(which, call, **{which: x[0, 0]})
    raises_naming("dy", favor.attention_backward, q, k, v, dy[0, 0])
    raises_naming("dy", favor.attention_backward, q, k, v, dy[0])


@pytest.mark.parametrize("axis", [0, 1, 2, 3])
@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_empty_dims(qkv, which, axis):
    q, k, v, dy = qkv
    args = dict(q=q, k=k, v=v)
    empty = np.take(args[which], [], axis=axis)
    for name, call in attention_calls(q, k, v, dy).items():
        with pytest.raises(favor.Error) as info:
            call(**{which: empty})
        # an empty D is reported as the head dim d; everything else names the array
        msg = str(info.value)
        assert names(msg, which) or (axis == 3 and which != "v" and names(msg, "d")), msg
    with pytest.raises(favor.Error):
        favor.features(np.zeros((2, 0), np.float32), features=8)


# ---------------------------------------------------------------- dtypes and values

BAD_DTYPES = [np.int32, np.int64, np.uint8, bool, np.complex64, np.complex128, object, str]


def every_call_refuses(q, k, v, dy, which, bad, word):
    """Each attention call that takes `which` raises naming it, with `word` in the message."""
    for name, call in attention_calls(q, k, v, dy).items():
        if which == "dy" and "backward" not in name:
            continue
        assert word in raises_naming(which, call, **{which: bad})


@pytest.mark.parametrize("dtype", BAD_DTYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("which", ["q", "k", "v", "dy"])
def test_non_float_dtypes(qkv, which, dtype):
    q, k, v, dy = qkv
    args = dict(q=q, k=k, v=v, dy=dy)
    bad = args[which].astype(dtype)
    every_call_refuses(q, k, v, dy, which, bad, "dtype")
    if which == "q":
        raises_naming("x", favor.features, bad, features=8)
        raises_naming("q", favor.fit_kernel, "favorpp", bad, k)
        raises_naming("matrix", favor.Projection.from_matrix, np.ones((4, 4), dtype=dtype))


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("which", ["q", "k", "v", "dy"])
def test_non_finite_values(qkv, which, value):
    q, k, v, dy = qkv
    args = dict(q=q, k=k, v=v, dy=dy)
    bad = args[which].copy()
    bad[1, 2, N - 1, 3] = value  # the very last row: validation must see the whole array
    kept = bad.copy()
    every_call_refuses(q, k, v, dy, which, bad, "finite")
    if which == "q":
        raises_naming("x", favor.features, bad, features=8)
        raises_naming("q", favor.fit_kernel, "favorsharp", bad, k)
    # nothing written into the caller's arrays
    assert np.array_equal(bad, kept, equal_nan=True)
    for name, x in dict(q=q, k=k, v=v, dy=dy).items():
        assert np.all(np.isfinite(x)), name


def test_metrics_reject_non_finite_values(qkv):
    q, k, v, dy = qkv
    bad = q[1, 2].copy()
    bad[N - 1, 3] = np.nan
    raises_naming("x", favor.kernel_mse, bad, k[0, 0], features=8)
    raises_naming("approx", favor.relative_frobenius_error, bad, q[1, 2])


def test_inputs_untouched_after_failed_calls(qkv):
    q, k, v, dy = qkv
    saved = [x.copy() for x in (q, k, v, dy)]
    for call in [lambda: favor.attention(q, k, v[:, :, :5]),
                 lambda: favor.attention(q, k, v, kernel="nope"),
                 lambda: favor.attention(q, k, v, causal=True, kernel="favorpp"),
                 lambda: favor.attention_backward(q, k, v, dy[..., :2]),
                 lambda: favor.exact_attention(q, k, v, accumulate="f16")]:
        with pytest.raises(favor.Error):
            call()
    for a, b in zip((q, k, v, dy), saved):
        assert np.array_equal(a, b)


# ---------------------------------------------------------------- masks

def test_bad_key_masks(qkv):
    q, k, v, dy = qkv
    ok = np.ones((B, N), dtype=bool)
    bad_masks = [ok[:, :N - 1], ok[:1], ok[0], ok[:, :, None], np.ones((B, N + 1), bool),
                 ok.astype(np.float32), ok.astype(np.float64), ok.astype(np.complex64),
                 ok.astype(object), ok.astype(str)]
    for mask in bad_masks:
        for name, call in attention_calls(q, k, v, dy).items():
            raises_naming("key_mask", call, key_mask=mask)
        raises_naming("key_mask", favor.fit_kernel, "favorpp", q, k, key_mask=mask)
    # 2-D inputs take a [Nk] mask, not [1, Nk]
    raises_naming("key_mask", favor.attention, q[0, 0], k[0, 0], v[0, 0], key_mask=ok[:1])
    raises_naming("key_mask", favor.exact_attention, q[0, 0], k[0, 0], v[0, 0],
                  key_mask=ok[0, :N - 1])


# ---------------------------------------------------------------- parameters

def test_impossible_parameters(qkv):
    q, k, v, dy = qkv
    for features in (0, -3, 2.5, 16.0, "8", True):
        raises_naming("features", favor.attention, q, k, v, features=features)
        raises_naming("features", favor.features, q, features=features)
    raises_naming("features", favor.attention, q, k, v,
                  projection=favor.Projection.draw(8, D), features=16)
    for seed in (-1, 2**64, 1.5, "0"):
        raises_naming("seed", favor.attention, q, k, v, seed=seed)
    raises_naming("kernel", favor.attention, q, k, v, kernel="gaussian")
    raises_naming("kernel", favor.attention_backward, q, k, v, dy, kernel="gaussian")
    raises_naming("kernel", favor.features, q, kernel="gaussian")
    raises_naming("kernel", favor.fit_kernel, "gaussian", q, k)
    raises_naming("kernel", favor.fit_kernel, "positive", q, k)  # nothing to fit
    raises_naming("projection", favor.attention, q, k, v, projection="gaussian")
    raises_naming("projection", favor.attention, q, k, v, projection=3)
    raises_naming("projection", favor.attention, q, k, v, projection=favor.Projection.draw(8, 4))
    raises_naming("kind", favor.Projection.draw, 8, D, kind="gaussian")
    raises_naming("norms", favor.attention, q, k, v, norms="gaussian")
    raises_naming("norms", favor.attention, q, k, v, projection="qmc", norms="fixed")
    raises_naming("norms", favor.Projection.draw, 8, D, norms="quantile")  # radial only
    raises_naming("method", favor.attention, q, k, v, method="linear")
    raises_naming("kernel", favor.attention, q, k, v, method="exact", kernel="gaussian")
    raises_naming("context", favor.attention_backward, q, k, v, dy, context="not a context")
    raises_naming("accumulate", favor.attention, q, k, v, method="exact", accumulate="f16")
    raises_naming("accumulate", favor.exact_attention, q, k, v, accumulate="bf16")
    for scale in (0.0, -1.0, float("nan"), float("inf")):
        raises_naming("scale", favor.attention, q, k, v, scale=scale)
        raises_naming("scale", favor.exact_attention, q, k, v, scale=scale)
        raises_naming("scale", favor.features, q, scale=scale)
    # dW is offered for every kernel (FAVOR++/FAVOR# with the fit held fixed): not an error
    assert favor.attention_backward(q, k, v, dy, kernel="favorpp", features=8,
                                    projection_grad=True).dw.shape == (8, D)


def test_causal_rules(qkv):
    q, k, v, dy = qkv
    short_k, short_v = k[:, :, :N - 2], v[:, :, :N - 2]
    for call in (favor.attention, favor.exact_attention):
        msg = raises_naming("q", call, q, short_k, short_v, causal=True)
        assert "causal" in msg and names(msg, "k")
    raises_naming("q", favor.attention_backward, q, short_k, short_v, dy, causal=True)
    for kernel in ("favorpp", "favorsharp"):
        # causal FAVOR++/FAVOR# without a fit would let positions see future tokens
        raises_naming("fit", favor.attention, q, k, v, causal=True, kernel=kernel)
        raises_naming("fit", favor.attention_backward, q, k, v, dy, causal=True, kernel=kernel)


def test_bad_fits(qkv):
    q, k, v, dy = qkv
    fit = favor.fit_kernel("favorpp", q, k)
    for kernel in ("positive", "trig", "hyperbolic"):  # these take no fit
        raises_naming("fit", favor.attention, q, k, v, kernel=kernel, fit=fit)
        raises_naming("fit", favor.attention, q, k, v, kernel=kernel, fit=-0.1)
        raises_naming("fit", favor.features, q, kernel=kernel, fit=fit)
        raises_naming("fit", favor.attention_backward, q, k, v, dy, kernel=kernel, fit=fit)
    raises_naming("fit", favor.attention, q, k, v, kernel="favorsharp", fit=-0.1)  # one A: ++
    raises_naming("fit", favor.attention, q, k, v, kernel="favorpp", fit="-0.1")
    raises_naming("fit", favor.attention, q, k, v, kernel="favorpp",
                  fit=favor.fit_kernel("favorpp", q[:, :2], k[:, :2]))  # 4 heads, B*H = 6
    raises_naming("fit", favor.attention, q, k, v, kernel="favorpp",
                  fit=favor.KernelFit.constant(-0.1, D - 1))
    raises_naming("fit", favor.features, q, kernel="favorsharp")  # features() needs one
    raises_naming("a", favor.attention, q, k, v, kernel="favorpp", fit=0.2)  # A < 1/8
    raises_naming("a", favor.KernelFit.constant, 0.125, D)
    raises_naming("a", favor.KernelFit.constant, float("nan"), D)
    raises_naming("d", favor.KernelFit.constant, -0.1, 0)
    raises_naming("a", favor.KernelFit, np.zeros(3), np.zeros((1, 3, 3)))
    raises_naming("basis", favor.KernelFit, np.zeros((2, 3)), np.zeros((2, 3, 2)))
    raises_naming("rho", favor.optimal_a, -1.0)
    raises_naming("rho", favor.optimal_a, float("nan"))


def test_threads():
    before = favor.num_threads()
    for n in (0, -1):
        raises_naming("threads", favor.set_num_threads, n)
    assert favor.num_threads() == before


def test_projection_errors():
    raises_naming("m", favor.Projection.draw, 0, 4)
    raises_naming("d", favor.Projection.draw, 4, 0)
    raises_naming("d", favor.Projection.draw, 4, 1, kind="simplex")
    raises_naming("d", favor.Projection.draw, 4, 4000, kind="qmc")
    raises_naming("norms", favor.Projection.draw, 4, 4, kind="dct", norms="fixed")
    raises_naming("matrix", favor.Projection.from_matrix, np.ones(4))
    raises_naming("matrix", favor.Projection.from_matrix, "abc")
    raises_naming("m", favor.Projection.from_matrix, np.ones((0, 4)))
    bad = np.ones((3, 4))
    bad[2, 1] = np.inf
    raises_naming("matrix", favor.Projection.from_matrix, bad)
    raises_naming("redraw", favor.Projection.from_matrix(np.ones((3, 4))).redraw, 1)


def test_metric_errors(qkv):
    q, k, v, dy = qkv
    raises_naming("x", favor.kernel_mse, q, k, features=8)  # [N, D] rows only
    raises_naming("y", favor.kernel_mse, q[0, 0], k[0, 0, :, :4], features=8)
    raises_naming("approx", favor.relative_frobenius_error, q, k[..., :4])
    raises_naming("exact", favor.relative_frobenius_error, q, np.zeros_like(q))
    raises_naming("x", favor.features, q * 40, kernel="trig", features=8)  # overflows f32


def test_backward_context_from_other_inputs(qkv):
    q, k, v, dy = qkv
    ctx = favor.attention(q, k, v, features=8, full_output=True).context
    raises_naming("context", favor.attention_backward, q, k[:, :, ::-1], v, dy, features=8,
                  context=ctx)
    raises_naming("context", favor.attention_backward, q, k, v, dy, features=8, seed=1,
                  context=ctx)


# ---------------------------------------------------------------- Decoder misuse

@pytest.fixture
def decoder():
    w = favor.Projection.draw(16, D, seed=3)
    dec = favor.Decoder(B, H, DV, w)
    dec.append(rand((B, H, 4, D), 5), rand((B, H, 4, DV), 6))
    return dec


def test_decoder_construction_errors():
    w = favor.Projection.draw(16, D, seed=3)
    raises_naming("batch", favor.Decoder, 0, H, DV, w)
    raises_naming("heads", favor.Decoder, B, -1, DV, w)
    raises_naming("dv", favor.Decoder, B, H, 0, w)
    raises_naming("projection", favor.Decoder, B, H, DV, "orthogonal")
    raises_naming("kernel", favor.Decoder, B, H, DV, w, kernel="gaussian")
    raises_naming("scale", favor.Decoder, B, H, DV, w, scale=-1.0)
    raises_naming("fit", favor.Decoder, B, H, DV, w, kernel="favorpp")  # needs a fit
    raises_naming("fit", favor.Decoder, B, H, DV, w, kernel="favorsharp", fit=-0.1)
    raises_naming("fit", favor.Decoder, B, H, DV, w, fit=favor.KernelFit.constant(-0.1, D))
    q, k = rand((B, 2, 6, D), 7), rand((B, 2, 6, D), 8)
    raises_naming("fit", favor.Decoder, B, H, DV, w, kernel="favorpp",
                  fit=favor.fit_kernel("favorpp", q, k))  # 4 heads for B*H = 6
    raises_naming("fit", favor.Decoder, B, H, DV, w, kernel="favorpp",
                  fit=favor.KernelFit.constant(-0.1, D + 1))


def test_decoder_failed_append_changes_nothing(decoder):
    q = rand((B, H, 3, D), 9)
    before = decoder.query(q)
    position, nbytes = decoder.position, decoder.state_bytes
    k, v = rand((B, H, 3, D), 10), rand((B, H, 3, DV), 11)
    k_nan, v_inf = k.copy(), v.copy()
    k_nan[B - 1, H - 1, 2, D - 1] = np.nan   # valid tokens first, the bad value last
    v_inf[B - 1, H - 1, 2, DV - 1] = np.inf
    bad_appends = [
        ("k", k[..., :D - 1], v), ("v", k, v[..., :DV - 1]),        # D, Dv
        ("k", k[:1], v[:1]), ("k", k[:, :2], v[:, :2]),             # B, H
        ("v", k, v[:, :, :2]),                                       # T of k vs v
        ("k", k[0], v[0]), ("k", k[0, 0], v[0, 0]),                 # rank 3; 2-D for B*H > 1
        ("k", k_nan, v), ("v", k, v_inf),                           # NaN/Inf last
        ("k", k.astype(np.int32), v), ("v", k, v.astype(bool)),     # dtypes
        ("k", k[:, :, :0], v[:, :, :0]),                            # T = 0
    ]
    for argument, kk, vv in bad_appends:
        raises_naming(argument, decoder.append, kk, vv)
        assert decoder.position == position, argument
        assert decoder.state_bytes == nbytes
        # the state is exactly what it was: the same query gives the same bits
        assert np.array_equal(decoder.query(q), before), argument
    # ... and the decoder still works
    decoder.append(k, v)
    assert decoder.position == position + 3


def test_decoder_failed_query_changes_nothing(decoder):
    q = rand((B, H, 3, D), 12)
    before = decoder.query(q)
    q_nan = q.copy()
    q_nan[B - 1, H - 1, 2, D - 1] = np.nan
    for bad in (q[..., :D - 1], q[:1], q[:, :2], q[0], q_nan, q.astype(np.complex64)):
        raises_naming("q", decoder.query, bad)
        assert decoder.position == 4
    assert np.array_equal(decoder.query(q), before)
