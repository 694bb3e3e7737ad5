"""favor releases the GIL while it computes: two Python threads can run favor calls side by
side (with the results of single-threaded calls), and another Python thread makes progress
while one is inside a long favor call. No timing assertions beyond "progress > 0".
"""
import sys
import threading
import time

import numpy as np
import pytest

import favor
from conftest import rand

# Large enough that one call takes ~0.1 s on one thread: causal, B*H = 4, N = 8192, m = 256.
SHAPE = (1, 4, 8192, 64)


@pytest.fixture(scope="module")
def problems():
    out = []
    for seed in (1, 10):
        q, k, v = rand(SHAPE, seed, 8.0 ** 0.5), rand(SHAPE, seed + 1, 8.0 ** 0.5), \
            rand(SHAPE, seed + 2)
        out.append((q, k, v))
    return out


def call(problem):
    q, k, v = problem
    return favor.attention(q, k, v, causal=True, features=256, seed=3)


def test_two_python_threads_give_the_single_thread_results(problems, single_thread):
    expected = [call(p) for p in problems]
    results = [None, None]
    errors = []

    def worker(i):
        try:
            for _ in range(2):
                results[i] = call(problems[i])
        except Exception as e:  # reported below; a thread cannot fail the test itself
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    # one favor thread per call, distinct outputs: the same code on the same values
    for got, want in zip(results, expected):
        assert np.array_equal(got, want)


def vq_call(problem):
    q, k, v = problem
    return favor.vq_attention(q, k, v, k[0, :, :64], causal=True)  # 64 codes per head


@pytest.mark.parametrize("fn", [call, vq_call], ids=["favor", "vq"])
def test_other_python_threads_run_during_a_favor_call(problems, single_thread, fn):
    # The counter thread counts only while the favor call is in flight (between `inside`
    # being set and cleared by the calling thread). The switch interval is raised far above
    # the call's length, so a favor that kept the GIL could never be interrupted: the
    # calling thread would set the flag, run favor and clear the flag without the counter
    # thread ever seeing it set (the count would be 0). The counter thread sleeps between
    # increments (sleeping releases the GIL), so the calling thread gets the GIL back at
    # once when favor returns.
    state = {"inside": False, "stop": False, "count": 0}

    def counter():
        while not state["stop"]:
            if state["inside"]:
                state["count"] += 1
            time.sleep(0.0005)

    def caller():
        state["inside"] = True
        try:
            state["result"] = fn(problems[0])
        finally:
            state["inside"] = False

    interval = sys.getswitchinterval()
    sys.setswitchinterval(30.0)
    try:
        count_thread = threading.Thread(target=counter)
        count_thread.start()
        caller_thread = threading.Thread(target=caller)
        caller_thread.start()
        caller_thread.join()
        state["stop"] = True
        count_thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert "result" in state  # the call itself succeeded
    assert state["count"] > 0
