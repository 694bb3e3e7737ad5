"""favor._core.Decoder / VQDecoder state: state() -> load_state(**state) into a fresh decoder
continues bit for bit; select(indices) equals a decoder of the reordered batch; bad arrays
raise favor.Error naming the argument. Bit-identity is exact: both sides run the same
float32 operations on the same values."""
import numpy as np
import pytest

from favor import _core

B, H, N, D, DV, M, C = 3, 2, 20, 8, 5, 16, 7


def rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


Q, K, V = rand((B, H, N, D), 1), rand((B, H, N, D), 2), rand((B, H, N, DV), 3)
CODEBOOK = rand((H, C, D), 4)
W = _core.Projection.draw(M, D, seed=7)


def favor_decoder(batch):
    return _core.Decoder(batch, H, DV, W)


def vq_decoder(batch):
    return _core.VQDecoder(batch, H, DV, CODEBOOK, tau=0.5)


def run(dec, q, k, v, begin, end):
    """A prefill of 4 tokens, then single tokens, querying after each: the outputs."""
    out, i = [], begin
    while i < end:
        n = min(4, end - i) if i == begin else 1
        dec.append(k[:, :, i:i + n], v[:, :, i:i + n])
        out.append(dec.query(q[:, :, i + n - 1:i + n]))
        i += n
    return np.concatenate(out, axis=2)


@pytest.mark.parametrize("make", [favor_decoder, vq_decoder], ids=["favor", "vq"])
def test_state_round_trip_is_bit_identical(make):
    a = make(B)
    run(a, Q, K, V, 0, 8)
    state = a.state()
    assert state["position"] == 8 and state["sums"].dtype == np.float32
    b = make(B)
    assert not np.array_equal(b.query(Q[:, :, 8:9]), a.query(Q[:, :, 8:9]))
    b.load_state(**state)
    assert b.position == 8
    np.testing.assert_array_equal(run(a, Q, K, V, 8, N), run(b, Q, K, V, 8, N))


@pytest.mark.parametrize("make", [favor_decoder, vq_decoder], ids=["favor", "vq"])
@pytest.mark.parametrize("rows", [[1, 0, 2], [1, 0], [2, 2, 0, 1]])
def test_select_equals_reordered_batch(make, rows):
    a = make(B)
    run(a, Q, K, V, 0, 8)
    a.select(rows)
    assert a.batch == len(rows)
    q, k, v = Q[rows], K[rows], V[rows]
    b = make(len(rows))
    run(b, q, k, v, 0, 8)
    np.testing.assert_array_equal(run(a, q, k, v, 8, N), run(b, q, k, v, 8, N))


def test_bad_state_names_the_argument():
    dec = favor_decoder(B)
    run(dec, Q, K, V, 0, 3)
    state = dec.state()
    with pytest.raises(_core.Error, match=r"sums: shape \[3,2,33,6\] must be"):
        dec.load_state(**{**state, "sums": np.zeros((3, 2, 33, 6), np.float32)})
    with pytest.raises(_core.Error, match=r"log_max: shape \[2,3\]"):
        dec.load_state(**{**state, "log_max": np.zeros((2, 3))})
    with pytest.raises(_core.Error, match=r"state.row_positions\[0\]: 4 must be in \[0, position = 3\]"):
        dec.load_state(**{**state, "row_positions": np.array([4, 3, 3])})
    bad = state["log_max"].copy()
    bad[0, 1] = np.nan
    with pytest.raises(_core.Error, match=r"state.log_max\[1\]: nan"):
        dec.load_state(**{**state, "log_max": bad})
    with pytest.raises(_core.Error, match=r"indices\[1\]: 3 must be in \[0, batch = 3\)"):
        dec.select([0, 3])
    vq = vq_decoder(B)
    vstate = vq.state()
    with pytest.raises(_core.Error, match=r"counts: shape \[3,2\] must be \[batch, heads, codes\]"):
        vq.load_state(**{**vstate, "counts": np.zeros((3, 2), np.float32)})
    assert dec.position == 3 and vq.position == 0
