"""favor's sequence-parallel torch ops (favor/ops/sequence_parallel): favor::
sequence_parallel_attention(_backward) and favor::sequence_parallel_vq_attention(_backward).

- torch.library.opcheck of each op: with one rank every check (schema, fake tensors,
  autograd registration, AOT dispatch with dynamic shapes); with two ranks as threads (each
  rank runs the same checks on its slice, so every real call is a collective the other rank
  is in) all but the AOT dispatch one, which compiles (Dynamo is not thread-safe);
- favor.distributed.attention and vq_attention run these ops, forward and backward (a
  dispatch mode records the ops called), and nothing else of favor's;
- torch.compile(fullgraph=True) of a function calling the op traces it as one node and gives
  the eager output and gradients bit for bit (the same C++ call; aot_eager);
- the exchange handle: an unknown one is refused by name; the table does not keep an
  exchange alive.

The numerics of the sequence split against one process live in test_distributed_gloo.py,
test_distributed_vq.py and test_distributed_mpi.py.
"""
import gc

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import favor
import favor.distributed as fd
from conftest import opcheck_tolerance
from distributed_helpers import Solo, as_threads
from favor.ops.sequence_parallel import exchange_handle
from favor.ops.sequence_parallel.attention import (sequence_parallel_attention_backward_op,
                                                   sequence_parallel_attention_op)
from favor.ops.sequence_parallel.exchanges import exchange_of
from favor.ops.sequence_parallel.vq import (sequence_parallel_vq_attention_backward_op,
                                            sequence_parallel_vq_attention_op)

N = 12
LENGTHS = [5, 7]  # two ranks' slices of the N positions
W = favor.make_projection(8, "orthogonal", features=16, seed=3)


def randn(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype)


def qkv(a=0, b=N):
    """q, k, v [2, 2, b - a, 8] (rows a..b of the whole sequence), requiring grad."""
    return tuple((0.5 * randn(2, 2, N, 8, seed=s))[:, :, a:b].clone().requires_grad_(True)
                 for s in (0, 1, 2))


def attention_args(a, b, handle, kernel="positive", causal=False, mask=False, learned=False,
                   decay=False):
    """The op's arguments for rows a..b: favor::attention's (test_torch_ops.py) and the
    exchange's handle."""
    q, k, v = qkv(a, b)
    weights = bias = lam = gamma = None
    if learned:
        weights = (0.3 * randn(2, 16, 8, seed=7)).requires_grad_(True)
        bias = (0.1 * randn(2, 16, seed=8)).requires_grad_(True)
        lam = (1 + 0.1 * randn(2, 16, seed=9)).requires_grad_(True)
    if decay:
        gamma = torch.tensor([0.9, 0.8], dtype=torch.float64, requires_grad=True)
    kpm = None
    if mask:
        kpm = torch.zeros(2, N, dtype=torch.bool)
        kpm[0, 1::4] = True
        kpm = kpm[:, a:b]
    w = torch.from_numpy(W.matrix.copy()).requires_grad_(True)
    return (q, k, v, w, weights, bias, lam, gamma, kpm, None, None, kernel, causal, None,
            handle)


CASES = {
    "positive": dict(),
    "trig": dict(kernel="trig"),
    "favorpp_whole_sequence_fit": dict(kernel="favorpp"),
    "causal": dict(causal=True),
    "masked": dict(mask=True),
    "hedgehog_learned": dict(kernel="hedgehog", learned=True),
    "learned_decay": dict(learned=True, decay=True, causal=True),
}


# Dynamo is not thread-safe: two ranks as threads run opcheck's checks but the AOT dispatch
# one (which compiles); one rank runs them all.
THREAD_SAFE_CHECKS = ("test_schema", "test_autograd_registration", "test_faketensor")
# N tokens, 16 features (W above).
OPCHECK_TOL = opcheck_tolerance(N, 16)


def over_ranks(check, ranks):
    """check(a, b, exchange, opcheck) on each rank's slice: two threads (ThreadExchange) or
    Solo."""
    if ranks == 1:
        opcheck = lambda op, args: torch.library.opcheck(op, args, **OPCHECK_TOL)
        return [check(0, N, Solo(), opcheck)]
    opcheck = lambda op, args: torch.library.opcheck(op, args, test_utils=THREAD_SAFE_CHECKS,
                                                     **OPCHECK_TOL)
    return as_threads(LENGTHS, lambda r, ex, a, b: check(int(a), int(b), ex, opcheck))


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize("case", list(CASES))
def test_opcheck_sequence_parallel_attention(case, ranks, single_thread):
    def check(a, b, ex, opcheck):
        args = attention_args(a, b, exchange_handle(ex), **CASES[case])
        opcheck(sequence_parallel_attention_op, args)
        y = sequence_parallel_attention_op(*args).detach()
        dy = randn(*y.shape, seed=11 + a)
        detached = [t.detach() if isinstance(t, torch.Tensor) else t for t in args[:11]]
        opcheck(sequence_parallel_attention_backward_op,
                              (dy, *detached, *args[11:], True))
    over_ranks(check, ranks)


def vq_args(a, b, handle, causal, tau):
    q, k, v = qkv(a, b)
    codebook = randn(2, 5, 8, seed=4).requires_grad_(True)
    return (q, k, v, codebook, None, causal, None, tau, 4, handle)


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize("tau", [0.0, 0.5])
@pytest.mark.parametrize("causal", [False, True])
def test_opcheck_sequence_parallel_vq_attention(causal, tau, ranks, single_thread):
    def check(a, b, ex, opcheck):
        args = vq_args(a, b, exchange_handle(ex), causal, tau)
        opcheck(sequence_parallel_vq_attention_op, args)
        dy = randn(2, 2, b - a, 8, seed=6 + a)
        detached = [t.detach() if isinstance(t, torch.Tensor) else t for t in args[:4]]
        opcheck(sequence_parallel_vq_attention_backward_op,
                              (dy, *detached, *args[4:], True))
    over_ranks(check, ranks)


class OpNames(TorchDispatchMode):
    """Records the names of the favor:: ops dispatched."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if name.startswith("favor."):
            self.names.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("vq", [False, True])
def test_layers_run_the_ops(vq, single_thread):
    """favor.distributed.attention / vq_attention (two ranks as threads): the forward runs
    the sequence-parallel op, the backward its backward op, and no other favor op but the
    projection's draw."""
    def call(r, ex, a, b):
        q, k, v = qkv(a, b)
        with OpNames() as mode:
            if vq:
                book = randn(2, 5, 8, seed=4).requires_grad_(True)
                y = fd.vq_attention(q, k, v, book, causal=True, exchange=ex)
            else:
                y = fd.attention(q, k, v, causal=True, kernel="positive", seed=5, exchange=ex)
            forward = list(mode.names)
            y.square().sum().backward()
        return forward, mode.names[len(forward):], q.grad is not None
    name = "favor.sequence_parallel_vq_attention" if vq else "favor.sequence_parallel_attention"
    for forward, backward, has_grad in as_threads(LENGTHS, call):
        assert [n for n in forward if n != "favor.projection"] == [name]
        assert backward == [name + "_backward"]
        assert has_grad


def test_compile_fullgraph_equals_eager():
    """torch.compile(fullgraph=True, aot_eager) of a function around the op (one rank): the
    op is one node; output and gradients equal eager bit for bit."""
    ex = Solo()
    handle = exchange_handle(ex)

    def f(q, k, v, w):
        y = sequence_parallel_attention_op(q * 1.5, k, v, w, None, None, None, None, None, None,
                                           None, "positive", True, None, handle)
        return torch.tanh(y)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    results = []
    for fn in (f, compiled):
        q, k, v = qkv()
        w = torch.from_numpy(W.matrix.copy()).requires_grad_(True)
        y = fn(q, k, v, w)
        y.sum().backward()
        results.append((y.detach(), q.grad, k.grad, v.grad, w.grad))
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_unknown_handle_is_refused():
    with pytest.raises(favor.Error, match="exchange: handle 12345 names no live"):
        exchange_of(12345)


def test_the_handle_table_keeps_no_exchange_alive():
    ex = Solo()
    handle = exchange_handle(ex)
    assert exchange_of(handle) is ex
    del ex
    gc.collect()
    with pytest.raises(favor.Error, match="names no live"):
        exchange_of(handle)
