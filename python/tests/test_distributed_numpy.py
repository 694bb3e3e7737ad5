"""favor.distributed's FAVOR attention with every rank in this process: one rank with a
trivial exchange (Solo) equals favor.attention bit for bit; three ranks as threads
(ThreadExchange: each collective evaluates its definition) equal one process, with learned
maps and their parameter gradients; Python exceptions and malformed results of an exchange's
methods; errors of calls without other ranks; StateBlock and combine_states; the GIL is
released during a call (FAVOR and VQ).

Run: cd python/tests && PYTHONPATH=<build>/python python3 -m pytest -q test_distributed_numpy.py
"""
import sys
import threading
import time

import numpy as np
import pytest

import favor
import favor.distributed as fd
from distributed_cases import M
from distributed_helpers import EPS32, Solo, as_threads


def _qkv(seed=0, n=13):
    rng = np.random.default_rng(seed)
    return [(0.5 * rng.standard_normal((2, 3, n, 8))).astype(np.float32) for _ in range(3)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kernel", ["positive", "trig", "favorpp"])
def test_one_rank_equals_favor_attention_bitwise(kernel, causal):
    # N = 40: favor.attention takes the tiled path, as a rank does. (Shorter bidirectional
    # calls with 2F features take the short path, (phi(Q) phi(K)^T) [V | 1]: the same
    # features summed in another order; its agreement with the tiled path is tested in C++,
    # FavorAttention.ShortPathEqualsTiledPath.)
    q, k, v = _qkv(n=40)
    kw = dict(kernel=kernel, features=16, causal=causal, fit=0.1 if causal and
              kernel == "favorpp" else None)
    y, stats = fd.attention_numpy(q, k, v, exchange=Solo(), full_output=True, **kw)
    np.testing.assert_array_equal(y, favor.attention(q, k, v, **kw))
    assert (stats.offset, stats.total, stats.zero_rows) == (0, 40, 0)
    assert stats.payload_bytes > 0 and stats.collectives >= 3
    dy = _qkv(1, n=40)[0][..., :8]
    got = fd.attention_backward_numpy(q, k, v, dy, exchange=Solo(), **kw)
    for a, b in zip(got[:3], favor.attention_backward(q, k, v, dy, **kw)[:3]):
        np.testing.assert_array_equal(a, b)


def test_python_exceptions_in_collectives_propagate():
    q, k, v = _qkv()

    class Broken(Solo):
        def allreduce_states(self, block):
            raise KeyError("the network is down")

    with pytest.raises(KeyError, match="the network is down"):
        fd.attention_numpy(q, k, v, exchange=Broken())

    class Partial(fd.Exchange):
        def rank(self):
            return 0

        def size(self):
            return 1

    with pytest.raises(TypeError, match="does not implement allgather_text"):
        fd.attention_numpy(q, k, v, exchange=Partial())

    class Short(Solo):
        def allgather(self, values):
            return values[:1]

    with pytest.raises(favor.Error, match="Exchange.allgather: returned"):
        fd.attention_numpy(q, k, v, exchange=Short())


def test_state_block_and_combine_states():
    blk = fd.StateBlock(3, 5, distance=True)
    assert (blk.heads, blk.size, blk.distance) == (3, 5, True)
    assert blk.record_bytes == 32 + 8 * 5 and blk.nbytes == 3 * blk.record_bytes
    view = blk.bytes
    assert view.dtype == np.uint8 and view.flags.writeable and view.size == blk.nbytes
    assert blk.header(0) == (-np.inf, 0.0, 5, 1)
    # Records: one with values, combined onto an empty one (the identity).
    full = fd.StateBlock(3, 5, distance=True)
    for h in range(3):
        rec = full.bytes[h * full.record_bytes:(h + 1) * full.record_bytes]
        rec[:16].view(np.float64)[:] = (0.5, 4.0)
        rec[32:].view(np.float32)[:] = np.arange(10, dtype=np.float32) + h
    later = blk.bytes.copy()
    fd.combine_states(full.bytes, later, blk.record_bytes)
    np.testing.assert_array_equal(later, full.bytes)
    blk.bytes[:] = full.bytes
    blk.clear()
    assert blk.header(2) == (-np.inf, 0.0, 5, 1)
    with pytest.raises(favor.Error, match="record_bytes"):
        fd.combine_states(full.bytes, later, 12)
    with pytest.raises(favor.Error, match="read-only"):
        ro = later.copy()
        ro.flags.writeable = False
        fd.combine_states(full.bytes, ro, blk.record_bytes)
    with pytest.raises(favor.Error, match="uint8"):
        fd.combine_states(full.bytes.view(np.float32), later, blk.record_bytes)
    with pytest.raises(favor.Error, match="same whole records"):
        fd.combine_states(full.bytes[:-8], later[:-8], blk.record_bytes)
    other = fd.StateBlock(3, 4)
    with pytest.raises(favor.Error, match="different layouts"):
        fd.combine_states(other.bytes, other.bytes.copy(), blk.record_bytes)


def test_call_errors_without_other_ranks():
    import torch

    from favor.distributed.torch_exchange import TorchExchange
    q = torch.zeros(1, 1, 4, 8)
    if not torch.distributed.is_initialized():
        with pytest.raises(favor.Error, match="torch.distributed is not initialised"):
            TorchExchange()
        with pytest.raises(favor.Error, match="not initialised"):
            fd.attention(q, q, q)
    with pytest.raises(favor.Error, match="exchange: must be"):
        fd.attention(q, q, q, exchange="gloo")
    with pytest.raises(favor.Error, match="not both"):
        fd.attention(q, q, q, exchange=Solo(), group=object())
    with pytest.raises(favor.Error, match="exchange: must be"):
        fd.attention_numpy(q.numpy(), q.numpy(), q.numpy(), exchange=None)
    # favor._core's calls convert their arguments inside the agreement, None maps included
    qn = q.numpy()
    with pytest.raises(favor.Error, match="rank 0: TypeError: feature_map: None is not a"):
        favor._core.sequence_parallel_attention_map(qn, qn, qn, None, Solo())
    with pytest.raises(favor.Error, match="rank 0: TypeError: projection: None is not a"):
        favor._core.sequence_parallel_attention(qn, qn, qn, None, Solo())


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kernel", ["positive", "hedgehog"])
def test_threads_as_ranks_equal_one_process(kernel, causal, single_thread):
    """Three ranks (5 + 0 + 9 positions) as threads of this process, the numpy API with a
    learned map (and decay when causal) and its parameter gradients."""
    lengths = [5, 0, 9]
    rng = np.random.default_rng(3)
    q, k, v, dy = [(0.6 * rng.standard_normal((2, 2, 14, 6))).astype(np.float32)
                   for _ in range(4)]
    fm = favor.FeatureMap.learnable(kernel, M, 6, heads=2, seed=1)
    fm.bias[:] = 0.1 * rng.standard_normal(fm.bias.shape)
    kw = dict(causal=causal, feature_map=fm, decay=[0.9, 0.8] if causal else None)
    y0 = favor.attention(q, k, v, **kw)
    g0 = favor.attention_backward(q, k, v, dy, parameter_grads=True, **kw)

    def call(r, ex, a, b):
        s = lambda x: x[:, :, a:b]
        return (fd.attention_numpy(s(q), s(k), s(v), exchange=ex, **kw),
                fd.attention_backward_numpy(s(q), s(k), s(v), s(dy), exchange=ex,
                                            parameter_grads=True, **kw))

    out = as_threads(lengths, call)
    tol = 2 * (sum(lengths) + 2 * M) * EPS32
    rel = lambda a, b: np.abs(a - b).max() / np.abs(b).max()
    assert rel(np.concatenate([o[0] for o in out], axis=2), y0) <= tol
    for i in range(3):
        assert rel(np.concatenate([o[1][i] for o in out], axis=2), g0[i]) <= tol, i
    for i in range(3, 7):
        if g0[i] is not None:
            assert rel(sum(o[1][i] for o in out), g0[i]) <= tol, i


@pytest.mark.parametrize("method", ["favor", "vq"])
def test_the_gil_is_released_during_the_call(method, single_thread):
    """Another Python thread runs while one rank computes (causal, N = 8192, m = 256 or c =
    64 codes: ~0.1 s), as in test_gil.py: with the switch interval far above the call's
    length, a call that kept the GIL (its exchange's methods run Python without blocking)
    could not be interrupted, and the counter would never see the call in flight."""
    rng = np.random.default_rng(0)
    q, k, v = [rng.standard_normal((1, 4, 8192, 64)).astype(np.float32) * 0.3 for _ in range(3)]
    book = rng.standard_normal((4, 64, 64)).astype(np.float32) * 0.3
    state = {"inside": False, "stop": False, "count": 0}

    def counter():
        while not state["stop"]:
            if state["inside"]:
                state["count"] += 1
            time.sleep(0.0005)

    def caller():
        state["inside"] = True
        try:
            if method == "vq":
                state["result"] = fd.vq_attention_numpy(q, k, v, book, exchange=Solo(),
                                                        causal=True)
            else:
                state["result"] = fd.attention_numpy(q, k, v, exchange=Solo(), causal=True,
                                                     features=256)
        finally:
            state["inside"] = False

    interval = sys.getswitchinterval()
    sys.setswitchinterval(30.0)
    try:
        threads = [threading.Thread(target=counter), threading.Thread(target=caller)]
        threads[0].start()
        threads[1].start()
        threads[1].join()
        state["stop"] = True
        threads[0].join()
    finally:
        sys.setswitchinterval(interval)
    assert "result" in state and state["count"] > 0
