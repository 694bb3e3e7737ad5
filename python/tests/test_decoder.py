"""favor.Decoder (streaming FAVOR): query after appending tokens 0..i equals row i of causal
favor.attention; prefill equals token-by-token; reset; a state that does not grow.

Tolerance (conftest.py, docs/numerics.md rule 1): the decoder and causal favor.attention are
two float32 evaluations of one formula; each must be within twice the naive float32 error
of the double reference (+1e-6), so by the triangle inequality they differ from each other
by at most the sum of the two bounds. They are not bit-identical (the decoder rescales its
running state token by token, the batch kernel per 32-token chunk).
"""
import numpy as np
import pytest

import favor
from conftest import (ADAPTED, F32_SLACK, KERNELS, assert_twice_naive, calibration_fit, rand,
                      naive_attention, rel_err)

B, H, N, D, DV, M = 2, 2, 40, 8, 6, 24
NORM = D ** 0.25  # |x| = 1 at the default scale


def streamed(dec, q, k, v):
    """Appends token i and queries row i, for every i: the [B, H, N, Dv] rows."""
    rows = []
    for i in range(q.shape[2]):
        dec.append(k[:, :, i:i + 1], v[:, :, i:i + 1])
        rows.append(dec.query(q[:, :, i:i + 1]))
    return np.concatenate(rows, axis=2)


def bound(ref, naive):
    """The rule's bound for one float32 evaluation."""
    return 2.0 * rel_err(naive, ref) + F32_SLACK


@pytest.mark.parametrize("kernel", KERNELS)
def test_query_after_tokens_equals_causal_row(kernel):
    q, k, v = rand((B, H, N, D), 1, NORM), rand((B, H, N, D), 2, NORM), rand((B, H, N, DV), 3)
    w = favor.Projection.draw(M, D, seed=7)
    # FAVOR++/FAVOR#: the decoder never sees future tokens, so it needs a fit from
    # calibration data; the same fit for the batch call.
    fit = calibration_fit(kernel, (B, H, 30, D), 100, NORM) if kernel in ADAPTED else None
    dec = favor.Decoder(B, H, DV, w, kernel=kernel, fit=fit)
    assert dec.position == 0
    rows = streamed(dec, q, k, v)
    assert dec.position == N
    batch = favor.attention(q, k, v, causal=True, kernel=kernel, projection=w, fit=fit)
    ref = favor.reference.favor_attention(q, k, v, w, kernel=kernel, causal=True, fit=fit)
    naive = naive_attention(q, k, v, w, kernel, True, None, None, fit, np.float32)
    assert_twice_naive(rows, ref, naive, f"decoder {kernel}")
    assert_twice_naive(batch, ref, naive, f"causal attention {kernel}")
    assert rel_err(rows, batch) <= 2 * bound(ref, naive)


def test_favorpp_decoder_with_a_float_a():
    q, k, v = rand((B, H, N, D), 4, NORM), rand((B, H, N, D), 5, NORM), rand((B, H, N, DV), 6)
    w = favor.Projection.draw(M, D, seed=8)
    dec = favor.Decoder(B, H, DV, w, kernel="favorpp", fit=-0.05)
    rows = streamed(dec, q, k, v)
    fit = favor.KernelFit.constant(-0.05, D)
    ref = favor.reference.favor_attention(q, k, v, w, kernel="favorpp", causal=True, fit=fit)
    naive = naive_attention(q, k, v, w, "favorpp", True, None, None, fit, np.float32)
    assert_twice_naive(rows, ref, naive, "decoder favorpp A=-0.05")
    batch = favor.attention(q, k, v, causal=True, kernel="favorpp", projection=w, fit=-0.05)
    assert rel_err(rows, batch) <= 2 * bound(ref, naive)


@pytest.mark.parametrize("kernel", ["positive", "hyperbolic", "favorsharp"])
def test_prefill_equals_token_by_token(kernel):
    q, k, v = rand((B, H, N, D), 7, NORM), rand((B, H, N, D), 8, NORM), rand((B, H, N, DV), 9)
    w = favor.Projection.draw(M, D, seed=9)
    fit = calibration_fit(kernel, (B, H, 30, D), 110, NORM) if kernel in ADAPTED else None
    one = favor.Decoder(B, H, DV, w, kernel=kernel, fit=fit)
    token_rows = streamed(one, q, k, v)
    ref = favor.reference.favor_attention(q, k, v, w, kernel=kernel, causal=True, fit=fit)
    naive = naive_attention(q, k, v, w, kernel, True, None, None, fit, np.float32)
    tol = 2 * bound(ref, naive)
    # prefill: T tokens in one append, then the next tokens one by one
    for t in (1, 7, 32, 33):
        pre = favor.Decoder(B, H, DV, w, kernel=kernel, fit=fit)
        pre.append(k[:, :, :t], v[:, :, :t])
        assert pre.position == t
        first = pre.query(q[:, :, t - 1:t])
        rest = [first]
        for i in range(t, N):
            pre.append(k[:, :, i:i + 1], v[:, :, i:i + 1])
            rest.append(pre.query(q[:, :, i:i + 1]))
        got = np.concatenate(rest, axis=2)
        assert rel_err(got, token_rows[:, :, t - 1:]) <= tol, t
    # after all N tokens, a query of T rows reads the full state: bidirectional attention
    full = favor.Decoder(B, H, DV, w, kernel=kernel, fit=fit)
    full.append(k, v)
    every = full.query(q)
    ref_bi = favor.reference.favor_attention(q, k, v, w, kernel=kernel, fit=fit)
    naive_bi = naive_attention(q, k, v, w, kernel, False, None, None, fit, np.float32)
    assert_twice_naive(every, ref_bi, naive_bi, f"prefill query {kernel}")
    assert rel_err(every[:, :, -1:], token_rows[:, :, -1:]) <= tol


def test_reset():
    q, k, v = rand((B, H, N, D), 11, NORM), rand((B, H, N, D), 12, NORM), rand((B, H, N, DV), 13)
    w = favor.Projection.draw(M, D, seed=10)
    dec = favor.Decoder(B, H, DV, w)
    # a head with no appended token yields zeros
    assert np.array_equal(dec.query(q[:, :, :3]), np.zeros((B, H, 3, DV), np.float32))
    first = streamed(dec, q, k, v)
    bytes_before = dec.state_bytes
    dec.reset()
    assert dec.position == 0 and dec.state_bytes == bytes_before
    assert np.array_equal(dec.query(q[:, :, :3]), np.zeros((B, H, 3, DV), np.float32))
    # the same tokens from the reset state run the same code on the same values
    assert np.array_equal(streamed(dec, q, k, v), first)
    fresh = favor.Decoder(B, H, DV, w)
    assert np.array_equal(streamed(fresh, q, k, v), first)


def test_state_bytes_do_not_grow():
    w = favor.Projection.draw(M, D, seed=11)
    dec = favor.Decoder(B, H, DV, w, kernel="trig")
    start = dec.state_bytes
    # S (F x Dv) and s (F) float32 per (batch, head), F = 2m for trig: a lower bound
    assert start >= B * H * 2 * M * (DV + 1) * 4
    k, v = rand((B, H, 500, D), 14, NORM), rand((B, H, 500, DV), 15)
    for step in range(8):
        dec.append(k, v)
        assert dec.position == 500 * (step + 1)
        assert dec.state_bytes == start
    # and after 4000 tokens the state still answers like attention over all of them
    q = rand((B, H, 5, D), 16, NORM)
    got = dec.query(q)
    kk, vv = np.concatenate([k] * 8, axis=2), np.concatenate([v] * 8, axis=2)
    ref = favor.reference.favor_attention(q, kk, vv, w, kernel="trig")
    naive = naive_attention(q, kk, vv, w, "trig", False, None, None, None, np.float32)
    assert_twice_naive(got, ref, naive, "decoder at position 4000")


def test_rank2_decoder_and_properties():
    q, k, v = rand((N, D), 17, NORM), rand((N, D), 18, NORM), rand((N, DV), 19)
    w = favor.Projection.draw(M, D, seed=12)
    d2, d4 = favor.Decoder(1, 1, DV, w), favor.Decoder(1, 1, DV, w)
    assert (d2.batch, d2.heads, d2.dv, d2.projection.m, d2.projection.d) == (1, 1, DV, M, D)
    assert np.array_equal(d2.projection.matrix, w.matrix)
    assert "position=0" in repr(d2)
    for i in range(N):
        d2.append(k[i:i + 1], v[i:i + 1])
        d4.append(k[None, None, i:i + 1], v[None, None, i:i + 1])
        y2 = d2.query(q[i:i + 1])
        assert y2.shape == (1, DV)
        # [T, D] is [1, 1, T, D]: same code, same values
        assert np.array_equal(y2, d4.query(q[None, None, i:i + 1])[0, 0])
    assert "position=40" in repr(d2)


def test_decoder_strided_and_float64_inputs():
    # Strided float32 views are read in place, float64 converted: the same values give
    # the same state, bit for bit.
    k, v = rand((B, H, 10, D), 20, NORM), rand((B, H, 10, DV), 21)
    q = rand((B, H, 4, D), 22, NORM)
    w = favor.Projection.draw(M, D, seed=13)
    a, b = favor.Decoder(B, H, DV, w), favor.Decoder(B, H, DV, w)
    a.append(k, v)
    kt = np.ascontiguousarray(k.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    b.append(kt, v.astype(np.float64))
    assert np.array_equal(a.query(q), b.query(np.asfortranarray(q)))
