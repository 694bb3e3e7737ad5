"""favor.distributed's agreement before the C++ call: two ranks as threads of this process
(ThreadExchange), where rank 1 fails before the call with an exception other than a
ValueError (NO_HANG_CASES: pybind11's argument conversion, a 0-d tensor, an object without
bool(), a tensor modified in place before the backward, the output's allocation in the
binding) and rank 0 raises the same favor.Error instead of waiting forever; torch, numpy and
favor._core's calls, FAVOR and VQ.

Run: cd python/tests && PYTHONPATH=<build>/python python3 -m pytest -q test_distributed_no_hang.py
"""
import threading

import numpy as np
import pytest

import favor
import favor.distributed as fd
from distributed_helpers import Hub, ThreadExchange


def _small(seed=8):
    """q, k, v, dy [1, 2, 3, 4] float32 (one rank's slice) and a codebook [2, 4]."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in [(1, 2, 3, 4)] * 4 + [(2, 4)]]


def _torch_call(bad_kw=None, q0d=False, vq=False):
    """A torch-API rank: fd.attention (vq: fd.vq_attention) forward and backward; bad_kw
    replaces keywords, q0d makes q a 0-d tensor."""
    import torch

    def call(ex):
        q, k, v, _, book = [torch.from_numpy(a) for a in _small()]
        q.requires_grad_()
        if q0d:
            q = q.sum()
        kw = {"causal": True, **(bad_kw or {})}
        if vq:
            y = fd.vq_attention(q, k, v, book, exchange=ex, **kw)
        else:
            y = fd.attention(q, k, v, features=8, exchange=ex, **kw)
        y.sum().backward()
    return call


def _backward_inplace(vq):
    """A torch-API rank that modifies a tensor its forward saved: its backward's
    saved_tensors raises a RuntimeError while the other rank is in the backward's call."""
    import torch

    def call(ex):
        q, k, v, _, book = [torch.from_numpy(a) for a in _small()]
        k = k.requires_grad_() * 1.0
        y = (fd.vq_attention(q, k, v, book, exchange=ex) if vq else
             fd.attention(q, k, v, features=8, exchange=ex))
        k.add_(1.0)
        y.sum().backward()
    return call


def _numpy_call(backward=False, vq=False, huge=False, **bad_kw):
    """A numpy-API rank: attention(_backward)_numpy or vq_attention(_backward)_numpy; huge:
    q a zero-stride view of 2^40 rows (valid, no memory), so that the binding cannot allocate
    the output (256 TiB) before the call."""
    def call(ex):
        q, k, v, dy, book = _small()
        if huge:
            q = np.broadcast_to(q[:, :, :1], (1, 2, 2 ** 40, 4))
        if vq and backward:
            fd.vq_attention_backward_numpy(q, k, v, dy, book, exchange=ex, **bad_kw)
        elif vq:
            fd.vq_attention_numpy(q, k, v, book, exchange=ex, **bad_kw)
        elif backward:
            fd.attention_backward_numpy(q, k, v, dy, exchange=ex, features=8, **bad_kw)
        else:
            fd.attention_numpy(q, k, v, exchange=ex, features=8, **bad_kw)
    return call


def _core_call(name, **bad_kw):
    """favor._core's sequence-parallel calls themselves (the binding's own conversions)."""
    def call(ex):
        q, k, v, dy, book = _small()
        fm = favor.FeatureMap.learnable("positive", 8, 4, seed=1).core()
        proj = favor.Projection.draw(8, 4)
        core = favor._core
        run = {"attention": lambda: core.sequence_parallel_attention(
                   q, k, v, proj, ex, **bad_kw),
               "attention_map_backward": lambda: core.sequence_parallel_attention_map_backward(
                   q, k, v, dy, fm, ex, **bad_kw),
               "vq_attention_backward": lambda: core.sequence_parallel_vq_attention_backward(
                   q, k, v, dy, book, ex, **bad_kw)}
        run[name]()
    return call


# name -> (what the good rank 0 calls, what rank 1 calls, the type of rank 1's own error as
# the message names it, the type of its favor.Error's __cause__ or None, VQ)
NO_HANG_CASES = {
    "torch_causal_str": (_torch_call(), _torch_call({"causal": "yes"}), "TypeError",
                         TypeError, False),
    "torch_q_0d": (_torch_call(), _torch_call(q0d=True), "IndexError", IndexError, False),
    "torch_scale_str": (_torch_call(), _torch_call({"scale": "x"}), "TypeError", TypeError,
                        False),
    "torch_backward_inplace": (_torch_call({"causal": False}), _backward_inplace(False),
                               "RuntimeError", RuntimeError, False),
    "torch_vq_causal_str": (_torch_call(vq=True), _torch_call({"causal": "yes"}, vq=True),
                            "TypeError", TypeError, True),
    "torch_vq_backward_inplace": (_torch_call({"causal": False}, vq=True),
                                  _backward_inplace(True), "RuntimeError", RuntimeError, True),
    "numpy_causal_str": (_numpy_call(), _numpy_call(causal="yes"), "TypeError", None, False),
    "numpy_scale_str": (_numpy_call(), _numpy_call(scale="x"), "TypeError", TypeError, False),
    "numpy_full_output_list": (_numpy_call(), _numpy_call(full_output=[1]), "TypeError",
                               TypeError, False),
    "numpy_parameter_grads_array": (
        _numpy_call(backward=True),
        _numpy_call(backward=True, parameter_grads=np.array([True, False])), "TypeError",
        TypeError, False),
    "numpy_output_allocation": (_numpy_call(), _numpy_call(huge=True), "MemoryError", None,
                                False),
    "numpy_vq_output_allocation": (_numpy_call(vq=True), _numpy_call(vq=True, huge=True),
                                   "MemoryError", None, True),
    "numpy_vq_causal_str": (_numpy_call(vq=True), _numpy_call(vq=True, causal="yes"),
                            "TypeError", None, True),
    "numpy_vq_codebook_grad_str": (_numpy_call(backward=True, vq=True),
                                   _numpy_call(backward=True, vq=True, codebook_grad="yes"),
                                   "TypeError", None, True),
    "core_kernel_int": (_core_call("attention"), _core_call("attention", kernel=3),
                        "TypeError", None, False),
    "core_decay_str": (_core_call("attention_map_backward"),
                       _core_call("attention_map_backward", decay="x"), "TypeError", None,
                       False),
    "core_vq_block_float": (_core_call("vq_attention_backward"),
                            _core_call("vq_attention_backward", block=2.5), "TypeError", None,
                            True),
}


@pytest.mark.parametrize("case", NO_HANG_CASES)
def test_any_error_before_the_call_reaches_every_rank(case, single_thread):
    """Two thread ranks; rank 1 fails before the C++ call with an error other than a
    ValueError (pybind11's argument conversion, a 0-d tensor, an object without bool(), a
    tensor modified in place before the backward, the output's allocation in the binding)
    while rank 0 is in the call: every rank
    raises the same favor.Error naming rank 1 and the error's type, within the barrier's
    10 s (without the agreement rank 0 would wait forever; here its barrier breaks)."""
    good, bad, kind, cause, vq = NO_HANG_CASES[case]
    hub = Hub(2, timeout=10)
    raised = [None, None]

    def work(r):
        try:
            (bad if r == 1 else good)(ThreadExchange(hub, r))
        except BaseException as e:  # noqa: BLE001  checked below
            raised[r] = e

    threads = [threading.Thread(target=work, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(isinstance(e, favor.Error) for e in raised), raised
    assert str(raised[0]) == str(raised[1]), raised
    what = "sequence-parallel VQ attention" if vq else "sequence-parallel attention"
    assert str(raised[0]).startswith(f"{what}: rank 1: {kind}: "), str(raised[0])
    if cause is not None:
        assert isinstance(raised[1].__cause__, cause), repr(raised[1].__cause__)
