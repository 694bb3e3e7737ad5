"""favor.distributed's Transformer-VQ attention with every rank in this process: one rank
(Solo) equals favor.vq_attention's forward bit for bit and its backward within the VQ
tolerance, with what crosses not growing with N; three ranks as threads (ThreadExchange)
equal one process, key mask and codebook gradient included; errors of calls without other
ranks.

Run: cd python/tests && PYTHONPATH=<build>/python python3 -m pytest -q test_distributed_vq.py
"""
import numpy as np
import pytest

import favor
import favor.distributed as fd
from distributed_helpers import Solo, as_threads, vq_inputs, vq_tolerance


@pytest.mark.parametrize("tau", [0.0, 6.0])
@pytest.mark.parametrize("causal", [False, True])
def test_vq_one_rank_equals_favor_vq_attention(causal, tau):
    """One rank: the forward equals favor.vq_attention bit for bit; the backward within the
    VQ tolerance (hard VQ takes every code's moment route here, docs/vq.md); what crosses
    does not grow with N."""
    q, k, v, dy, book = vq_inputs(4)
    kw = dict(causal=causal, tau=tau)
    y, stats = fd.vq_attention_numpy(q, k, v, book, exchange=Solo(), full_output=True, **kw)
    np.testing.assert_array_equal(y, favor.vq_attention(q, k, v, book, **kw))
    assert (stats.offset, stats.total, stats.zero_rows) == (0, 14, 0)
    g, bstats = fd.vq_attention_backward_numpy(q, k, v, dy, book, exchange=Solo(),
                                               codebook_grad=True, full_output=True, **kw)
    assert isinstance(g, favor.VQGrads) and g.dcodebook.shape == book.shape
    want = favor.vq_attention_backward(q, k, v, dy, book, codebook_grad=True, **kw)
    tol = vq_tolerance([14])
    for name, a, b in zip(g._fields, g, want):
        assert np.abs(a - b).max() <= tol * np.abs(b).max(), name
    q2, k2, v2, dy2, _ = vq_inputs(5, n=28)
    _, stats2 = fd.vq_attention_numpy(q2, k2, v2, book, exchange=Solo(), full_output=True, **kw)
    _, bstats2 = fd.vq_attention_backward_numpy(q2, k2, v2, dy2, book, exchange=Solo(),
                                                codebook_grad=True, full_output=True, **kw)
    assert stats.payload_bytes > 0 and stats2.payload_bytes == stats.payload_bytes
    assert bstats.payload_bytes > 0 and bstats2.payload_bytes == bstats.payload_bytes


@pytest.mark.parametrize("tau", [0.0, 6.0])
@pytest.mark.parametrize("causal", [False, True])
def test_vq_threads_as_ranks_equal_one_process(causal, tau, single_thread):
    """Three ranks (5 + 0 + 9 positions) as threads, the VQ numpy API with a key mask: the
    slices of y, dq, dk, dv and the codebook gradient summed over ranks against
    favor.vq_attention(_backward) on the whole sequence."""
    lengths = [5, 0, 9]
    q, k, v, dy, book = vq_inputs(6)
    mask = np.ones((2, 14), dtype=bool)
    mask[0, ::3] = False
    kw = dict(causal=causal, tau=tau, key_mask=mask)
    y0 = favor.vq_attention(q, k, v, book, **kw)
    g0 = favor.vq_attention_backward(q, k, v, dy, book, codebook_grad=True, **kw)

    def call(r, ex, a, b):
        s = lambda x: x[:, :, a:b]
        mine = dict(kw, key_mask=mask[:, a:b], block=r + 2)  # the block need not agree
        return (fd.vq_attention_numpy(s(q), s(k), s(v), book, exchange=ex, **mine),
                fd.vq_attention_backward_numpy(s(q), s(k), s(v), s(dy), book, exchange=ex,
                                               codebook_grad=True, **mine))

    out = as_threads(lengths, call)
    tol = vq_tolerance(lengths)
    rel = lambda a, b: np.abs(a - b).max() / np.abs(b).max()
    assert rel(np.concatenate([o[0] for o in out], axis=2), y0) <= tol
    for i in range(3):
        assert rel(np.concatenate([o[1][i] for o in out], axis=2), g0[i]) <= tol, i
    assert rel(sum(o[1].dcodebook for o in out), g0.dcodebook) <= tol


def test_vq_call_errors_without_other_ranks():
    import torch
    q, k, v, _, book = vq_inputs(7)
    with pytest.raises(favor.Error, match="exchange: must be"):
        fd.vq_attention_numpy(q, k, v, book, exchange=None)
    t = torch.from_numpy(q)
    with pytest.raises(favor.Error, match="exchange: must be"):
        fd.vq_attention(t, t, t, torch.from_numpy(book), exchange="gloo")
    # A refused argument on the only rank: the error every rank raises.
    with pytest.raises(favor.Error, match="^sequence-parallel VQ attention: rank 0: block"):
        fd.vq_attention_numpy(q, k, v, book, exchange=Solo(), block=0)
    with pytest.raises(favor.Error, match="^sequence-parallel VQ attention: rank 0: codebook"):
        fd.vq_attention(t, t, t, torch.from_numpy(book)[0, 0], exchange=Solo())
    with pytest.raises(favor.Error, match="^sequence-parallel VQ attention: rank 0: tau"):
        fd.vq_attention_numpy(q, k, v, book, exchange=Solo(), tau=-1.0)
