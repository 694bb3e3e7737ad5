"""Array layouts of the numpy API: rank 2 vs rank 4, strided views (transposes, steps,
Fortran order, broadcast, negative strides), converted dtypes and byte orders, mask layouts;
float32 views are not copied and inputs are never modified.

Bit-identical comparisons (np.array_equal): the CPU kernels gather every tile of rows into
a contiguous buffer (src/cpu/feature_tile.cpp, exact_attention.cpp), so a strided view, a
rank-2 array and a converted copy all feed the kernels the same numbers in the same order.
"""
import tracemalloc

import numpy as np
import pytest

import favor
from conftest import ADAPTED, KERNELS, rand
from test_numpy_api import B, D, DV, H, M, NORM, problem


# ---------------------------------------------------------------- layouts

def test_rank2_equals_one_head_rank4():
    # [N, D] is [1, 1, N, D]: the same code on the same values, bit-identical.
    q, k, v = rand((30, D), 101, NORM), rand((35, D), 102, NORM), rand((35, DV), 103)
    dy = rand((30, DV), 104)
    mask = np.arange(35) % 5 != 0
    w = favor.Projection.draw(M, D, seed=13)
    q4, k4, v4, dy4 = (x[None, None] for x in (q, k, v, dy))
    for kernel in KERNELS:
        y2 = favor.attention(q, k, v, kernel=kernel, projection=w, key_mask=mask)
        assert y2.shape == (30, DV)
        assert np.array_equal(y2, favor.attention(q4, k4, v4, kernel=kernel, projection=w,
                                                  key_mask=mask[None])[0, 0])
        r2 = favor.reference.favor_attention(q, k, v, w, kernel=kernel, key_mask=mask)
        assert r2.shape == (30, DV) and r2.dtype == np.float64
    yc = favor.attention(q, q, v[:30], causal=True, projection=w)
    assert np.array_equal(yc, favor.attention(q4, q4, v4[:, :, :30], causal=True,
                                              projection=w)[0, 0])
    assert np.array_equal(favor.exact_attention(q, k, v, key_mask=mask),
                          favor.exact_attention(q4, k4, v4, key_mask=mask[None])[0, 0])
    g2 = favor.attention_backward(q, k, v, dy, projection=w, key_mask=mask, projection_grad=True)
    g4 = favor.attention_backward(q4, k4, v4, dy4, projection=w, key_mask=mask[None],
                                  projection_grad=True)
    for a, b in zip(g2[:3], g4[:3]):
        assert a.ndim == 2 and np.array_equal(a, b[0, 0])
    assert np.array_equal(g2.dw, g4.dw)
    ge2 = favor.exact_attention_backward(q, k, v, dy)
    ge4 = favor.exact_attention_backward(q4, k4, v4, dy4)
    for a, b in zip(ge2[:3], ge4[:3]):
        assert np.array_equal(a, b[0, 0])
    assert np.array_equal(favor.features(q, projection=w), favor.features(q4, projection=w)[0, 0])
    f2, f4 = favor.fit_kernel("favorsharp", q, k), favor.fit_kernel("favorsharp", q4, k4)
    assert np.array_equal(f2.a, f4.a) and np.array_equal(f2.basis, f4.basis)


def strided_variants(x):
    """(name, view) pairs holding the values of the C-contiguous float32 array x [B, H, N, D]
    in other layouts. float32 views with non-negative strides are used in place; the others
    (float64, big-endian, negative strides) are converted once to C-contiguous float32."""
    b, h, n, d = x.shape
    bnhd = np.ascontiguousarray(x.transpose(0, 2, 1, 3))  # [B, N, H, D] in memory
    big = np.zeros((b, h, 2 * n, 3 * d), dtype=np.float32)
    big[:, :, ::2, ::3] = x
    rev = np.ascontiguousarray(x[:, :, ::-1, :])
    return [
        ("transposed [B,N,H,D]->[B,H,N,D]", bnhd.transpose(0, 2, 1, 3)),
        ("slice with steps", big[:, :, ::2, ::3]),
        ("fortran order", np.asfortranarray(x)),
        ("negative strides", rev[:, :, ::-1, :]),
        ("float64", x.astype(np.float64)),
        ("big-endian >f4", x.astype(">f4")),
    ]


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_strided_inputs_equal_contiguous_copy(which, causal):
    q, k, v, mask = problem(causal, seed=111)
    w = favor.Projection.draw(M, D, seed=14)
    dy = rand((B, H, q.shape[2], DV), 115)
    base = dict(q=q, k=k, v=v)
    want_y = favor.attention(q, k, v, causal=causal, projection=w, key_mask=mask)
    want_e = favor.exact_attention(q, k, v, causal=causal, key_mask=mask)
    want_g = favor.attention_backward(q, k, v, dy, causal=causal, projection=w, key_mask=mask)
    for name, view in strided_variants(base[which]):
        assert np.array_equal(np.asarray(view, dtype=np.float32), base[which])
        args = dict(base)
        args[which] = view
        # Same float32 values, same kernels (tiles are gathered into contiguous buffers,
        # conversions are exact): bit-identical.
        y = favor.attention(causal=causal, projection=w, key_mask=mask, **args)
        assert np.array_equal(y, want_y), name
        assert np.array_equal(favor.exact_attention(causal=causal, key_mask=mask, **args),
                              want_e), name
        g = favor.attention_backward(dy=dy, causal=causal, projection=w, key_mask=mask, **args)
        for a, b in zip(g[:3], want_g[:3]):
            assert np.array_equal(a, b), name
        if which == "q":
            assert np.array_equal(favor.features(view, projection=w),
                                  favor.features(q, projection=w)), name


def test_broadcast_inputs():
    # np.broadcast_to gives stride 0 on the broadcast axes: used in place, same numbers as
    # the materialised copy (bit-identical).
    q, k, v, _ = problem(causal=False, seed=121)
    w = favor.Projection.draw(M, D, seed=15)
    kb = np.broadcast_to(k[:1, :1], k.shape)          # one key head for every (b, h)
    vb = np.broadcast_to(v[:, :, :1], v.shape)        # every key has the same value row
    qb = np.broadcast_to(q[0, 0, 0], q.shape)          # one query row everywhere
    for args in [(q, kb, v), (q, k, vb), (qb, k, v), (qb, kb, vb)]:
        copies = [np.ascontiguousarray(a) for a in args]
        assert np.array_equal(favor.attention(*args, projection=w),
                              favor.attention(*copies, projection=w))
        assert np.array_equal(favor.exact_attention(*args), favor.exact_attention(*copies))
    # every value row equal: attention returns that row (a convex combination)
    np.testing.assert_allclose(favor.attention(q, k, vb, projection=w),
                               np.broadcast_to(v[:, :, :1], (B, H, q.shape[2], DV)),
                               rtol=1e-5, atol=1e-6)


def test_mask_layouts():
    # bool, uint8, int8 (viewed in place) and wider integers (converted: nonzero = kept),
    # strided masks too: all the same mask.
    q, k, v, mask = problem(causal=False, seed=131)
    w = favor.Projection.draw(M, D, seed=16)
    want = favor.attention(q, k, v, projection=w, key_mask=mask)
    wide = np.zeros((B, 2 * k.shape[2]), dtype=bool)
    wide[:, ::2] = mask
    for m in [mask.astype(np.uint8), mask.astype(np.int8), mask.astype(np.int64) * 7,
              mask.astype(np.uint32), np.asfortranarray(mask), wide[:, ::2],
              mask.astype(np.int16)[:, ::-1][:, ::-1]]:
        assert np.array_equal(favor.attention(q, k, v, projection=w, key_mask=m), want)


def traced_peak(call):
    """Peak bytes numpy allocated (tracemalloc sees numpy's data buffers) during call()."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        call()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def test_float32_views_are_not_copied():
    # Observable through tracemalloc: numpy registers its data buffers with it, so a
    # conversion of q shows up as >= q.nbytes of traced allocation, while favor's own C++
    # buffers do not. q is 512 KiB; the output [N, 1] is 1 KiB.
    n, d = 256, 512
    q = rand((1, 1, n, d), 141, 1.0)
    k = rand((1, 1, n, d), 142, 1.0)
    v = rand((1, 1, n, 1), 143)
    w = favor.Projection.draw(8, d, seed=1)
    big = np.zeros((1, 1, 2 * n, 2 * d), dtype=np.float32)
    big[:, :, ::2, ::2] = q
    in_place = {"contiguous": q, "steps": big[:, :, ::2, ::2],
                "fortran": np.asfortranarray(q),
                "transposed": np.ascontiguousarray(q.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2),
                "broadcast": np.broadcast_to(q[:, :, :1], q.shape)}
    copied = {"float64": q.astype(np.float64),
              "negative strides": np.ascontiguousarray(q[:, :, ::-1])[:, :, ::-1],
              "big-endian": q.astype(">f4")}
    for name, x in copied.items():  # the measurement sees a conversion
        assert traced_peak(lambda: favor.attention(x, k, v, projection=w)) >= q.nbytes, name
    for name, x in in_place.items():
        assert traced_peak(lambda: favor.attention(x, k, v, projection=w)) < q.nbytes // 4, name
        assert traced_peak(lambda: favor.exact_attention(x, k, v)) < q.nbytes // 4, name


def test_inputs_are_not_modified():
    q, k, v, mask = problem(causal=False, seed=151)
    dy = rand((B, H, q.shape[2], DV), 152)
    saved = [a.copy() for a in (q, k, v, mask, dy)]
    for kernel in KERNELS:
        favor.attention(q, k, v, kernel=kernel, features=M, key_mask=mask)
        favor.attention_backward(q, k, v, dy, kernel=kernel, features=M, key_mask=mask)
        favor.features(q, kernel=kernel, features=M,
                       fit=favor.fit_kernel(kernel, q, k) if kernel in ADAPTED else None)
    favor.exact_attention(q, k, v, key_mask=mask)
    favor.exact_attention_backward(q, k, v, dy, key_mask=mask)
    for a, b in zip((q, k, v, mask, dy), saved):
        assert np.array_equal(a, b)
