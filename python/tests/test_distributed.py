"""favor.distributed: sequence-parallel attention (FAVOR and Transformer-VQ) over
torch.distributed (gloo) and mpi4py, against single-process favor.torch.attention and
favor.torch.vq_attention on the whole sequence.

The multi-process runs start one subprocess per rank (distributed_worker.py: gloo through a
file:// rendezvous in a temporary folder, no port chosen by hand; distributed_mpi_worker.py
under mpirun), each with one thread, and every rank runs all of distributed_cases.py once;
the tests below read the ranks' JSON results. A run that does not finish within RUN_TIMEOUT
(a hang) is killed and fails the tests that need it. Slices: 2 ranks 7 + 10 positions, 3
ranks 6 + 0 + 11 (an empty middle slice), 5 ranks 3 + 0 + 4 + 2 + 5 (deeper scan trees).

Tolerance: both sides are float32 evaluations of the same sums, reassociated where the
sequence is split (the states of the earlier ranks arrive as one rescaled term); each is
within about (N + F) eps32 of exact for these well-conditioned inputs, so they differ by at
most 2 (N + F) eps32 relative to the largest reference entry (N positions, F features per
row; 7.9e-6 to 1.2e-5 here; measured at most 3e-6). VQ (distributed_vq_cases.py): the same
rule with the c = 5 codes in place of F (5.2e-6 for 17 positions; measured at most 6.4e-7).
Soft VQ runs with tau = 6, where p(s|k) spreads over the codes: with keys near their codes
and a small tau, soft VQ's exact dk is a tiny difference of large terms, and single-process
favor is itself ~1e-4 of max |dk| off the float64 reference there.

In this process: one rank with a trivial exchange equals favor.attention bit for bit (and
favor.vq_attention's forward); three ranks as threads (ThreadExchange: each collective
evaluates its definition) equal one process, FAVOR and VQ;
two thread ranks where rank 1 fails before the C++ call with any exception (NO_HANG_CASES)
and rank 0 raises the same favor.Error instead of waiting; the GIL is released during a call;
Python exceptions and malformed results of an exchange's methods; StateBlock and
combine_states. Under mpirun: MPIExchange's free(), __del__ and shared resources.

Run: cd python/tests && PYTHONPATH=<build>/python python3 -m pytest -q test_distributed.py
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import favor
import favor.distributed as fd
from distributed_cases import ATTENTION_CASES, ERROR_CASES, M
from distributed_vq_cases import C as VQ_C
from distributed_vq_cases import VQ_CASES, VQ_ERROR_CASES

HERE = pathlib.Path(__file__).resolve().parent
EXAMPLE = HERE.parents[1] / "examples" / "distributed" / "train_split.py"
EPS32 = 2.0 ** -23
RUN_TIMEOUT = 120
SPLITS = {2: [7, 10], 3: [6, 0, 11]}
DEEP = (5, [3, 0, 4, 2, 5], ["exchange", "positive_causal", "mask", "decay_learned_causal",
                             "hedgehog_learned", "vq_hard_causal_mask", "vq_soft_mask_shared"])
_runs = {}


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1", FAVOR_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1", OMPI_MCA_btl_vader_single_copy_mechanism="none")
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # every rank on this machine
    return env


def _wait_all(procs, what):
    """Waits for every process; kills them all and fails on a hang or an exit code.
    Returns their outputs."""
    try:
        for p in procs:
            p.wait(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        outs = [p.communicate()[0] for p in procs]
        pytest.fail(f"{what}: no result after {RUN_TIMEOUT} s (a hang); output:\n"
                    + "\n".join(o[-3000:] for o in outs))
    outs = [p.communicate()[0] for p in procs]
    bad = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode != 0]
    assert not bad, f"{what}: exit codes {bad}\n" + "\n".join(o[-3000:] for o in outs)
    return outs


def _torch_run(tmp_path_factory, size, lengths, only=()):
    key = (size, tuple(only))
    if key not in _runs:
        d = tmp_path_factory.mktemp(f"gloo{size}")
        procs = [subprocess.Popen(
            [sys.executable, str(HERE / "distributed_worker.py"), str(r), str(size),
             ",".join(map(str, lengths)), str(d / "rendezvous"), str(d / f"rank{r}.json"),
             *only], cwd=HERE, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True) for r in range(size)]
        _wait_all(procs, f"{size} gloo ranks")
        _runs[key] = [json.loads((d / f"rank{r}.json").read_text()) for r in range(size)]
    return _runs[key]


def _tolerance(case, lengths):
    if case in VQ_CASES:
        return _vq_tolerance(lengths)
    kernel = ATTENTION_CASES.get(case, {}).get("kernel", "positive")
    features = 2 * M if kernel in ("trig", "hyperbolic", "hedgehog") else M
    return 2 * (sum(lengths) + features) * EPS32


def _vq_tolerance(lengths):
    """Transformer-VQ: as FAVOR's with the c = 5 codes in place of the F features (the
    per-code sums of N keys, the query-side sums over N rows, the codebook gradient summed
    over ranks; hard VQ's dk by the moment route, exact as the direct one)."""
    return 2 * (sum(lengths) + VQ_C) * EPS32


def _check_case(results, case, lengths):
    tol = _tolerance(case, lengths)
    for rank, res in enumerate(results):
        r = res[case]
        assert "failed" not in r, f"rank {rank}:\n{r['failed']}"
        for name, err in r["errors"].items():
            assert err <= tol, f"rank {rank} {case} {name}: relative error {err:.2e} > {tol:.2e}"


def _check_error(results, case, what="sequence-parallel attention"):
    """Every rank raised the same favor.Error naming the last rank; where the last rank's
    own error was another exception (ERROR_CAUSES), the message names its type and it is the
    last rank's __cause__."""
    messages = set()
    for rank, res in enumerate(results):
        r = res[case]
        assert "failed" not in r, f"rank {rank}:\n{r['failed']}"
        assert r["raised"] == "Error", f"rank {rank} raised {r['raised']} (a favor.Error expected)"
        messages.add(r["message"])
    assert len(messages) == 1, f"the ranks raised different errors: {messages}"
    message = messages.pop()
    assert message.startswith(what + ": "), message
    assert f"rank {len(results) - 1}" in message, message  # names the rank that broke it
    cause = ERROR_CAUSES.get(case)
    if cause is not None:
        assert f"rank {len(results) - 1}: {cause}: " in message, message
        assert results[-1][case]["cause"] == cause, results[-1][case]


# the error cases whose last rank fails with another exception than a ValueError
ERROR_CAUSES = {"error_type_error": "TypeError", "error_index_error": "IndexError",
                "error_backward_inplace": "RuntimeError", "vq_error_type_error": "TypeError"}


@pytest.mark.parametrize("size", sorted(SPLITS))
@pytest.mark.parametrize("case", ["exchange", *ATTENTION_CASES])
def test_gloo_slices_equal_single_process(tmp_path_factory, size, case):
    _check_case(_torch_run(tmp_path_factory, size, SPLITS[size]), case, SPLITS[size])


@pytest.mark.parametrize("size", sorted(SPLITS))
@pytest.mark.parametrize("case", ERROR_CASES)
def test_gloo_bad_use_raises_the_same_error_on_every_rank(tmp_path_factory, size, case):
    _check_error(_torch_run(tmp_path_factory, size, SPLITS[size]), f"error_{case}")


@pytest.mark.parametrize("size", sorted(SPLITS))
@pytest.mark.parametrize("case", VQ_CASES)
def test_gloo_vq_slices_equal_single_process(tmp_path_factory, size, case):
    _check_case(_torch_run(tmp_path_factory, size, SPLITS[size]), case, SPLITS[size])


@pytest.mark.parametrize("size", sorted(SPLITS))
@pytest.mark.parametrize("case", VQ_ERROR_CASES)
def test_gloo_vq_bad_use_raises_the_same_error_on_every_rank(tmp_path_factory, size, case):
    _check_error(_torch_run(tmp_path_factory, size, SPLITS[size]), f"vq_error_{case}",
                 "sequence-parallel VQ attention")


@pytest.mark.parametrize("case", DEEP[2])
def test_gloo_five_ranks(tmp_path_factory, case):
    size, lengths, only = DEEP
    _check_case(_torch_run(tmp_path_factory, size, lengths, only), case, lengths)


def test_mpi4py_exchange_under_mpirun(tmp_path):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun not found: install OpenMPI (scripts/install-deps.sh installs "
                    "openmpi-bin and python3-mpi4py) to test favor.distributed.MPIExchange")
    try:
        import mpi4py  # noqa: F401  (importing the package does not initialise MPI)
    except ImportError:
        pytest.skip("mpi4py not importable: install python3-mpi4py to test MPIExchange")
    lengths = [7, 10]
    p = subprocess.Popen([mpirun, "-np", "2", "--oversubscribe", "--allow-run-as-root",
                          sys.executable, str(HERE / "distributed_mpi_worker.py"),
                          ",".join(map(str, lengths)), str(tmp_path / "rank")],
                         cwd=HERE, env=_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    out = _wait_all([p], "mpirun -np 2")[0]
    results = [json.loads((tmp_path / f"rank.{r}.json").read_text()) for r in range(2)]
    # MPIExchange's free(), __del__ and the shared op and datatypes freed at exit, also after
    # MPI_Finalize, print nothing (an error in __del__ or atexit only prints)
    assert "Exception ignored" not in out and "Error in atexit" not in out, out[-3000:]
    for case in ["exchange", "mpi_free", *ATTENTION_CASES, *VQ_CASES]:
        _check_case(results, case, lengths)
    for case in ERROR_CASES:
        _check_error(results, f"error_{case}")
    for case in VQ_ERROR_CASES:
        _check_error(results, f"vq_error_{case}", "sequence-parallel VQ attention")


def test_train_split_example_check(tmp_path):
    """The example trains 2 steps over 2 processes; --check compares its first step with a
    single process (loss and every gradient within 1e-4, measured ~2e-6)."""
    p = subprocess.Popen([sys.executable, str(EXAMPLE), "--procs", "2", "--steps", "2",
                          "--check", "--length", "1024"], cwd=tmp_path, env=_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = _wait_all([p], "train_split.py")[0]
    assert "seed 0: 2 ranks, one window of 1024 characters" in out, out
    assert "tolerance 0.0001: OK" in out, out
    assert "step    2  loss" in out and "replicas identical" in out, out


# -- in one process ------------------------------------------------------------------------

class Solo(fd.Exchange):
    """The exchange of a single rank."""

    def rank(self):
        return 0

    def size(self):
        return 1

    def allgather(self, values):
        return values

    def allgather_text(self, text):
        return [text]

    def allreduce_sum(self, values):
        pass

    def allreduce_states(self, block):
        pass

    def exscan_states(self, block, reverse):
        block.clear()


def _qkv(seed=0):
    rng = np.random.default_rng(seed)
    return [(0.5 * rng.standard_normal((2, 3, 13, 8))).astype(np.float32) for _ in range(3)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kernel", ["positive", "trig", "favorpp"])
def test_one_rank_equals_favor_attention_bitwise(kernel, causal):
    q, k, v = _qkv()
    kw = dict(kernel=kernel, features=16, causal=causal, fit=0.1 if causal and
              kernel == "favorpp" else None)
    y, stats = fd.attention_numpy(q, k, v, exchange=Solo(), full_output=True, **kw)
    np.testing.assert_array_equal(y, favor.attention(q, k, v, **kw))
    assert (stats.offset, stats.total, stats.zero_rows) == (0, 13, 0)
    assert stats.payload_bytes > 0 and stats.collectives >= 3
    dy = _qkv(1)[0][..., :8]
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


class Hub:
    """What the ThreadExchanges of one group share: a barrier and a slot per rank."""

    def __init__(self, size, timeout=60):
        self.size, self.slots = size, [None] * size
        self.barrier = threading.Barrier(size, timeout=timeout)  # a hang raises, not blocks


class ThreadExchange(fd.Exchange):
    """Ranks as Python threads of one process: every collective gathers every rank's value
    and evaluates its definition (states combined one by one in rank order)."""

    def __init__(self, hub, rank):
        super().__init__()
        self.hub, self._rank = hub, rank

    def rank(self):
        return self._rank

    def size(self):
        return self.hub.size

    def _gather(self, x):
        self.hub.slots[self._rank] = x
        self.hub.barrier.wait()
        out = list(self.hub.slots)
        self.hub.barrier.wait()
        return out

    def allgather(self, values):
        return np.concatenate(self._gather(np.array(values)))

    def allgather_text(self, text):
        return self._gather(text)

    def allreduce_sum(self, values):
        values[:] = np.sum(self._gather(values.copy()), axis=0)

    @staticmethod
    def _combined(parts, record_bytes):
        acc = parts[0].copy()
        for part in parts[1:]:
            later = part.copy()
            fd.combine_states(acc, later, record_bytes)
            acc = later
        return acc

    def allreduce_states(self, block):
        block.bytes[:] = self._combined(self._gather(block.bytes.copy()), block.record_bytes)

    def exscan_states(self, block, reverse):
        parts = self._gather(block.bytes.copy())
        before = parts[self._rank + 1:][::-1] if reverse else parts[:self._rank]
        if before:
            block.bytes[:] = self._combined(before, block.record_bytes)
        else:
            block.clear()


def _as_threads(lengths, call):
    """call(rank, exchange, a, b) in one thread per rank; the results in rank order."""
    hub = Hub(len(lengths))
    offsets = np.cumsum([0, *lengths])
    out, errors = [None] * len(lengths), []

    def work(r):
        try:
            out[r] = call(r, ThreadExchange(hub, r), offsets[r], offsets[r + 1])
        except Exception as e:  # noqa: BLE001  reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(r,)) for r in range(len(lengths))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return out


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

    out = _as_threads(lengths, call)
    tol = 2 * (sum(lengths) + 2 * M) * EPS32
    rel = lambda a, b: np.abs(a - b).max() / np.abs(b).max()
    assert rel(np.concatenate([o[0] for o in out], axis=2), y0) <= tol
    for i in range(3):
        assert rel(np.concatenate([o[1][i] for o in out], axis=2), g0[i]) <= tol, i
    for i in range(3, 7):
        if g0[i] is not None:
            assert rel(sum(o[1][i] for o in out), g0[i]) <= tol, i


def _vq_inputs(seed, n=14, d=6):
    """q, k, v, dy [2, 2, n, d] and a codebook [2, 5, d] whose codes the keys lie near (no
    near-tie between two nearest codes: distributed_vq_cases.py)."""
    rng = np.random.default_rng(seed)
    book = rng.standard_normal((2, 5, d)).astype(np.float32)
    z = rng.integers(0, 5, (2, 2, n))
    k = book[np.arange(2)[None, :, None], z] + 0.35 * rng.standard_normal((2, 2, n, d))
    q, v, dy = [0.6 * rng.standard_normal((2, 2, n, d)) for _ in range(3)]
    return [a.astype(np.float32) for a in (q, k, v, dy)] + [book]


@pytest.mark.parametrize("tau", [0.0, 6.0])
@pytest.mark.parametrize("causal", [False, True])
def test_vq_one_rank_equals_favor_vq_attention(causal, tau):
    """One rank: the forward equals favor.vq_attention bit for bit; the backward within the
    VQ tolerance (hard VQ takes every code's moment route here, docs/vq.md); what crosses
    does not grow with N."""
    q, k, v, dy, book = _vq_inputs(4)
    kw = dict(causal=causal, tau=tau)
    y, stats = fd.vq_attention_numpy(q, k, v, book, exchange=Solo(), full_output=True, **kw)
    np.testing.assert_array_equal(y, favor.vq_attention(q, k, v, book, **kw))
    assert (stats.offset, stats.total, stats.zero_rows) == (0, 14, 0)
    g, bstats = fd.vq_attention_backward_numpy(q, k, v, dy, book, exchange=Solo(),
                                               codebook_grad=True, full_output=True, **kw)
    assert isinstance(g, favor.VQGrads) and g.dcodebook.shape == book.shape
    want = favor.vq_attention_backward(q, k, v, dy, book, codebook_grad=True, **kw)
    tol = _vq_tolerance([14])
    for name, a, b in zip(g._fields, g, want):
        assert np.abs(a - b).max() <= tol * np.abs(b).max(), name
    q2, k2, v2, dy2, _ = _vq_inputs(5, n=28)
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
    q, k, v, dy, book = _vq_inputs(6)
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

    out = _as_threads(lengths, call)
    tol = _vq_tolerance(lengths)
    rel = lambda a, b: np.abs(a - b).max() / np.abs(b).max()
    assert rel(np.concatenate([o[0] for o in out], axis=2), y0) <= tol
    for i in range(3):
        assert rel(np.concatenate([o[1][i] for o in out], axis=2), g0[i]) <= tol, i
    assert rel(sum(o[1].dcodebook for o in out), g0.dcodebook) <= tol


def test_vq_call_errors_without_other_ranks():
    import torch
    q, k, v, _, book = _vq_inputs(7)
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
