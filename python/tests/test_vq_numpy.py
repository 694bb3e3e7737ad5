"""The Transformer-VQ numpy API (favor.vq_attention, vq_attention_backward, vq_assign,
commitment_loss, Codebook, VQDecoder, attention(method='vq')) against the double reference
favor.reference.vq_* and against numpy evaluations of the formulas.

Tolerance: the 2x-naive-float32 rule of conftest.py, with the naive float32 evaluation of
the materialised VQ formula (naive_vq below) on the same quantised keys.
"""
import math

import numpy as np
import pytest

import favor
from conftest import F32_SLACK, rand, rel_err

B, H, D, DV, C = 2, 2, 8, 6, 5
NORM = D ** 0.25


def problem(causal, seed=1, nq=41, nk=45, shared=False):
    nk = nq if causal else nk
    q = rand((B, H, nq, D), seed, NORM)
    k = rand((B, H, nk, D), seed + 1, NORM)
    v = rand((B, H, nk, DV), seed + 2)
    book = rand((C, D) if shared else (H, C, D), seed + 3, NORM)
    j = np.arange(nk)
    mask = np.stack([j % 3 != 1, j % 4 != 2])
    return q, k, v, book, mask


def naive_vq(q, k, v, book, causal=False, key_mask=None, tau=0.0, dtype=np.float32):
    """The materialised formula of math.md s.6 in `dtype`: hard A_ij = exp(s q_i.C_zj);
    soft A_ij = sum_s exp(s q_i.C_s) p(s|k_j); y = A V / A 1 (max-subtracted per row)."""
    nq, nk = q.shape[2], k.shape[2]
    s = dtype(1.0 / math.sqrt(q.shape[3]))
    book3 = np.broadcast_to(book if book.ndim == 3 else book[None], (H,) + book.shape[-2:])
    out = np.zeros((B, H, nq, v.shape[3]), dtype)
    for b in range(B):
        for h in range(H):
            cb = book3[h].astype(dtype)
            kk, qq = k[b, h].astype(dtype), q[b, h].astype(dtype)
            d2 = ((kk[:, None, :] - cb[None]) ** 2).sum(-1)                  # [Nk, c]
            qc = s * (qq @ cb.T)                                             # [Nq, c]
            if tau == 0:
                logits = qc[:, d2.argmin(1)]
            else:
                lp = -d2 / dtype(tau)
                lp = lp - lp.max(1, keepdims=True)
                lp = lp - np.log(np.exp(lp).sum(1, keepdims=True))
                t = qc[:, None, :] + lp[None]
                top = t.max(-1)
                logits = top + np.log(np.exp(t - top[..., None]).sum(-1))
            vis = np.ones((nq, nk), bool)
            if causal:
                vis &= np.tril(np.ones((nq, nk), bool))
            if key_mask is not None:
                vis &= key_mask[b][None] != 0
            logits = np.where(vis, logits, -np.inf)
            top = logits.max(1, keepdims=True)
            p = np.where(vis, np.exp(logits - np.where(np.isfinite(top), top, 0)), 0)
            den = p.sum(1, keepdims=True)
            with np.errstate(invalid="ignore", divide="ignore"):
                out[b, h] = np.where(den > 0, (p @ v[b, h].astype(dtype)) / den, 0)
    return out


def check_twice_naive(fast, ref, naive, what):
    err, naive_err = rel_err(fast, ref), rel_err(naive, ref)
    assert err <= 2 * naive_err + F32_SLACK, (what, err, naive_err)


@pytest.mark.parametrize("tau", [0.0, 0.7], ids=["hard", "soft"])
@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_vq_attention_within_twice_naive_float32_of_reference(causal, masked, tau):
    q, k, v, book, mask = problem(causal)
    key_mask = mask if masked else None
    out = favor.vq_attention(q, k, v, book, causal=causal, key_mask=key_mask, tau=tau,
                             full_output=True)
    ref = favor.reference.vq_attention(q, k, v, book, causal=causal, key_mask=key_mask, tau=tau)
    assert out.y.shape == (B, H, q.shape[2], DV) and out.y.dtype == np.float32
    assert ref.dtype == np.float64 and out.zero_rows == 0
    # The numpy twin of the formula agrees with the C++ reference in double (to rounding):
    # both read the formula the same way.
    assert rel_err(naive_vq(q, k, v, book, causal, key_mask, tau, np.float64), ref) < 1e-12
    check_twice_naive(out.y, ref, naive_vq(q, k, v, book, causal, key_mask, tau), "y")
    # Causal results do not depend on the block length (float rounding only).
    if causal:
        for block in (1, 7, 64):
            y = favor.vq_attention(q, k, v, book, causal=True, key_mask=key_mask, tau=tau,
                                   block=block)
            check_twice_naive(y, ref, naive_vq(q, k, v, book, True, key_mask, tau), block)


def test_shared_codebook_2d_and_codebook_object_and_attention_dispatch():
    q, k, v, book, _ = problem(False, shared=True)
    y = favor.vq_attention(q, k, v, book)
    # [c, D] is one codebook for all heads: the same as [1, c, D] and as [H, c, D] repeated.
    assert np.array_equal(y, favor.vq_attention(q, k, v, book[None]))
    np.testing.assert_allclose(y, favor.vq_attention(q, k, v, np.repeat(book[None], H, 0)),
                               rtol=0, atol=1e-6)
    assert np.array_equal(y, favor.vq_attention(q, k, v, favor.Codebook(book)))
    assert np.array_equal(y, favor.attention(q, k, v, method="vq", codebook=book))
    # One head, 2-D arrays in and out.
    y2 = favor.vq_attention(q[0, 0], k[0, 0], v[0, 0], book)
    assert y2.shape == (q.shape[2], DV) and np.array_equal(y2, favor.vq_attention(
        q[:1, :1], k[:1, :1], v[:1, :1], book)[0, 0])


def test_hard_vq_with_keys_as_codebook_is_exact_attention():
    # Every key its own code: the quantised keys are the keys, so hard VQ is softmax attention.
    q, k, v, _, _ = problem(False, nk=12)
    k1 = k[:1, :1]
    y = favor.vq_attention(q[:1, :1], k1, v[:1, :1], k1[0])
    ye = favor.exact_attention(q[:1, :1], k1, v[:1, :1])
    np.testing.assert_allclose(y, ye, rtol=0, atol=1e-5)


def test_all_masked_rows_are_zero_and_counted():
    q, k, v, book, _ = problem(True)
    mask = np.ones((B, q.shape[2]), bool)
    mask[0, :5] = False  # causal rows 0..4 of batch 0 see no key
    out = favor.vq_attention(q, k, v, book, causal=True, key_mask=mask, full_output=True)
    assert out.zero_rows == 5 * H
    assert np.all(out.y[0, :, :5] == 0) and np.all(np.abs(out.y[0, :, 5]) > 0)


@pytest.mark.parametrize("tau", [0.0, 0.7], ids=["hard", "soft"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_backward_matches_reference(causal, tau):
    q, k, v, book, mask = problem(causal, nq=23, nk=19)
    dy = rand((B, H, q.shape[2], DV), 9)
    g = favor.vq_attention_backward(q, k, v, dy, book, causal=causal, key_mask=mask, tau=tau,
                                    codebook_grad=True)
    ref = favor.reference.vq_attention_backward(q, k, v, dy, book, causal=causal, key_mask=mask,
                                                tau=tau)
    for name, got, want in zip(g._fields, g, ref):
        assert got.shape == want.shape and got.dtype == np.float32, name
        # Gradients of a float32 computation: a few hundred ulps of the largest entry.
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max() + 1e-6, name
    assert favor.vq_attention_backward(q, k, v, dy, book).dcodebook is None


def test_vq_assign_matches_reference_and_distances():
    _, k, _, book, _ = problem(False)
    codes, dist = favor.vq_assign(k, book, distances=True)
    assert codes.shape == (B, H, k.shape[2]) and codes.dtype == np.int32
    assert np.array_equal(codes, favor.reference.vq_assign(k, book))
    d2 = ((k[:, :, :, None, :].astype(np.float64) - book[None, :, None]) ** 2).sum(-1)
    np.testing.assert_array_equal(codes, d2.argmin(-1))
    np.testing.assert_allclose(dist, d2.min(-1), rtol=1e-5, atol=1e-6)
    assert np.array_equal(favor.vq_assign(k[0, 0], book[0]), codes[0, 0])


def test_commitment_loss_value_and_gradient():
    _, k, _, book, mask = problem(False)
    beta = 0.3
    r = favor.commitment_loss(k, book, beta=beta, key_mask=mask)
    z = favor.reference.vq_assign(k, book).reshape(B, H, -1)
    cz = np.stack([np.stack([book[h][z[b, h]] for h in range(H)]) for b in range(B)])
    diff = k.astype(np.float64) - cz
    keep = np.broadcast_to(mask[:, None, :], z.shape)
    want = beta * (diff ** 2).sum(-1)[keep].mean()
    assert r.loss == pytest.approx(want, rel=1e-5)
    want_dk = 2 * beta * diff * keep[..., None] / keep.sum()
    np.testing.assert_allclose(r.dk, want_dk, rtol=1e-4, atol=1e-7)


def test_codebook_kmeans_history_ema_save_load(tmp_path):
    k = rand((B, H, 64, D), 5, NORM)
    book = favor.Codebook.kmeans(k, 6, iterations=8, seed=3)
    assert book.values.shape == (H, 6, D) and book.values.dtype == np.float32
    # Seeding plus 8 Lloyd iterations; Lloyd never increases the error.
    assert len(book.history) == 9
    assert all(b <= a * (1 + 1e-6) for a, b in zip(book.history, book.history[1:]))
    assert book.quantisation_error(k) == pytest.approx(book.history[-1], rel=1e-4)
    assert book.history[-1] < book.history[0]
    # Deterministic in (keys, codes, options).
    assert np.array_equal(book.values, favor.Codebook.kmeans(k, 6, iterations=8, seed=3).values)
    pooled = favor.Codebook.kmeans(k, 6, iterations=8, per_head=False)
    assert pooled.values.shape == (1, 6, D)
    # save / load round trip.
    path = tmp_path / "book.npy"
    book.save(path)
    again = favor.Codebook.load(path)
    assert np.array_equal(again.values, book.values)
    with pytest.raises(ValueError):
        book.values[0, 0, 0] = 1.0  # read-only view


def test_codebook_ema_update_moves_codes_to_key_means_and_resets_dead_codes():
    k = rand((1, 1, 40, D), 6, NORM)
    book = favor.Codebook(np.stack([k[0, 0, 0], k[0, 0, 1], k[0, 0, 2] + 100.0])[None])
    z = favor.vq_assign(k, book)[0, 0]
    assert 2 not in z  # the far code gets no key
    before = book.values.copy()
    reset = book.ema_update(k, decay=0.5, dead_after=0)
    assert reset == 0 and book.unused.tolist() == [[0, 0, 1]]
    for s in (0, 1):  # sum = 0.5 C + 0.5 sum_keys, count = 0.5 + 0.5 n, C = sum / count
        keys = k[0, 0][z == s].astype(np.float64)
        want = (0.5 * before[0, s] + 0.5 * keys.sum(0)) / (0.5 + 0.5 * len(keys))
        np.testing.assert_allclose(book.values[0, s], want, rtol=1e-5, atol=1e-6)
    assert np.array_equal(book.values[0, 2], before[0, 2])
    # dead_after=2: the second update it goes unused re-seeds it from a key of that call.
    assert book.ema_update(k, decay=0.5, dead_after=2) == 1
    assert book.unused[0, 2] == 0 and book.updates == 2
    assert np.any(np.all(np.isclose(book.values[0, 2], k[0, 0]), axis=-1))


def test_vq_decoder_equals_causal_attention():
    q, k, v, book, _ = problem(True, nq=13)
    for tau in (0.0, 0.5):
        dec = favor.VQDecoder(B, H, DV, book, tau=tau)
        size = dec.state_bytes
        rows = []
        for i in range(q.shape[2]):
            dec.append(k[:, :, i:i + 1], v[:, :, i:i + 1])
            rows.append(dec.query(q[:, :, i:i + 1]))
        y = favor.vq_attention(q, k, v, book, causal=True, tau=tau)
        np.testing.assert_allclose(np.concatenate(rows, 2), y, rtol=0, atol=2e-6)
        assert dec.position == q.shape[2] and dec.state_bytes == size and dec.codes == C
        dec.reset()
        assert dec.position == 0


@pytest.mark.parametrize("call, name", [
    (lambda q, k, v, c: favor.vq_attention(q, k, v, c[..., :3]), "codebook"),
    (lambda q, k, v, c: favor.vq_attention(q, k, v, c[None]), "codebook"),
    (lambda q, k, v, c: favor.vq_attention(q, k, v, c.astype(np.int32)), "codebook"),
    (lambda q, k, v, c: favor.vq_attention(q, k, v, c, tau=-1.0), "tau"),
    (lambda q, k, v, c: favor.vq_attention(q, k, v, c, block=0), "block"),
    (lambda q, k, v, c: favor.vq_attention(q, k[:, :, :3], v, c), None),
    (lambda q, k, v, c: favor.vq_attention(q, k, v, c, key_mask=np.ones(3, bool)), "key_mask"),
    (lambda q, k, v, c: favor.vq_assign(k, np.full_like(c, np.nan)), "codebook"),
    (lambda q, k, v, c: favor.Codebook.kmeans(k, 10_000), "codes"),
    (lambda q, k, v, c: favor.attention(q, k, v, method="vq"), "codebook"),
    (lambda q, k, v, c: favor.attention(q, k, v, codebook=c), "codebook"),
    (lambda q, k, v, c: favor.VQDecoder(B, H, DV, c[..., :3]).append(k, v), None),
])
def test_errors_name_the_argument(call, name):
    q, k, v, book, _ = problem(False)
    with pytest.raises(favor.Error) as e:
        call(q, k, v, book)
    assert isinstance(e.value, ValueError)
    if name:
        assert str(e.value).startswith(name + ":"), str(e.value)
