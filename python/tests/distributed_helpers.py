"""Shared helpers of the favor.distributed tests (test_distributed_*.py): running the ranks
as subprocesses and checking their JSON results, and the exchanges that keep every rank in
this process (Solo: one rank; ThreadExchange: ranks as Python threads).

Tolerance: both sides are float32 evaluations of the same sums, reassociated where the
sequence is split (the states of the earlier ranks arrive as one rescaled term); each is
within about (N + F) eps32 of exact for these well-conditioned inputs, so they differ by at
most 2 (N + F) eps32 relative to the largest reference entry (N positions, F features per
row; 7.9e-6 to 1.2e-5 here; measured at most 3e-6). VQ (distributed_vq_cases.py): the same
rule with the c = 5 codes in place of F (5.2e-6 for 17 positions; measured at most 6.4e-7).
Soft VQ runs with tau = 6, where p(s|k) spreads over the codes: with keys near their codes
and a small tau, soft VQ's exact dk is a tiny difference of large terms, and single-process
favor is itself ~1e-4 of max |dk| off the float64 reference there.
"""
import os
import pathlib
import subprocess
import threading

import numpy as np
import pytest

import favor.distributed as fd
from distributed_cases import ATTENTION_CASES, M
from distributed_vq_cases import C as VQ_C
from distributed_vq_cases import VQ_CASES

HERE = pathlib.Path(__file__).resolve().parent
EPS32 = 2.0 ** -23
RUN_TIMEOUT = 120

# the error cases whose last rank fails with another exception than a ValueError
ERROR_CAUSES = {"error_type_error": "TypeError", "error_index_error": "IndexError",
                "error_backward_inplace": "RuntimeError", "vq_error_type_error": "TypeError"}


# -- ranks as subprocesses -----------------------------------------------------------------

def env():
    """The ranks' environment: one thread each, every rank on this machine."""
    e = dict(os.environ, OMP_NUM_THREADS="1", FAVOR_NUM_THREADS="1",
             OPENBLAS_NUM_THREADS="1", OMPI_MCA_btl_vader_single_copy_mechanism="none")
    e.setdefault("GLOO_SOCKET_IFNAME", "lo")  # every rank on this machine
    return e


def wait_all(procs, what):
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


def tolerance(case, lengths):
    if case in VQ_CASES:
        return vq_tolerance(lengths)
    kernel = ATTENTION_CASES.get(case, {}).get("kernel", "positive")
    features = 2 * M if kernel in ("trig", "hyperbolic", "hedgehog") else M
    return 2 * (sum(lengths) + features) * EPS32


def vq_tolerance(lengths):
    """Transformer-VQ: as FAVOR's with the c = 5 codes in place of the F features (the
    per-code sums of N keys, the query-side sums over N rows, the codebook gradient summed
    over ranks; hard VQ's dk by the moment route, exact as the direct one)."""
    return 2 * (sum(lengths) + VQ_C) * EPS32


def check_case(results, case, lengths):
    tol = tolerance(case, lengths)
    for rank, res in enumerate(results):
        r = res[case]
        assert "failed" not in r, f"rank {rank}:\n{r['failed']}"
        for name, err in r["errors"].items():
            assert err <= tol, f"rank {rank} {case} {name}: relative error {err:.2e} > {tol:.2e}"


def check_error(results, case, what="sequence-parallel attention"):
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


# -- ranks in this process -----------------------------------------------------------------

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


def as_threads(lengths, call):
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


def vq_inputs(seed, n=14, d=6):
    """q, k, v, dy [2, 2, n, d] and a codebook [2, 5, d] whose codes the keys lie near (no
    near-tie between two nearest codes: distributed_vq_cases.py)."""
    rng = np.random.default_rng(seed)
    book = rng.standard_normal((2, 5, d)).astype(np.float32)
    z = rng.integers(0, 5, (2, 2, n))
    k = book[np.arange(2)[None, :, None], z] + 0.35 * rng.standard_normal((2, 2, n, d))
    q, v, dy = [0.6 * rng.standard_normal((2, 2, n, d)) for _ in range(3)]
    return [a.astype(np.float32) for a in (q, k, v, dy)] + [book]
