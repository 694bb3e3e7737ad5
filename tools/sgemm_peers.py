"""favor bench's yardstick peers: the sgemm rate of numpy's and torch's BLAS on this machine,
in the same run as favor's (tools/bench_runner.cpp), so that favor's rates can be read
against the best BLAS the machine has, not only the one favor links.

    python sgemm_peers.py N THREADS REPEATS MIN_TIME

Prints one JSON object: {"numpy": {"gflops": ..., "blas": "..."}, "torch": {...}}; a
library that is not installed is left out. Each rate is the median of REPEATS timed
N x N x N products of float32 matrices after a warm-up (at least MIN_TIME seconds in all),
on THREADS threads."""
import json
import os
import sys
import time


def median_rate(fn, n, repeats, min_time):
    fn()
    times, start = [], time.perf_counter()
    while len(times) < repeats or time.perf_counter() - start < min_time:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    times.sort()
    return 2.0 * n ** 3 / times[len(times) // 2] / 1e9


def numpy_blas(np):
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        try:
            from threadpoolctl import threadpool_info
            for lib in threadpool_info():
                if lib.get("internal_api") in ("openblas", "mkl"):
                    arch = lib.get("architecture") or ""
                    return f"{lib['internal_api']} {lib.get('version')} {arch}".strip()
        except ImportError:
            pass
        return f"{blas.get('name')} {blas.get('version')}"
    except Exception:  # pragma: no cover - best effort description
        return "unknown"


def main():
    n, threads, repeats = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    min_time = float(sys.argv[4])
    out = {}
    try:
        import numpy as np
    except ImportError:
        np = None
    if np is not None:
        try:
            from threadpoolctl import threadpool_limits
            limit = threadpool_limits(limits=threads, user_api="blas")
        except ImportError:
            limit = None
        a = np.ones((n, n), np.float32)
        b = np.full((n, n), 0.5, np.float32)
        c = np.empty((n, n), np.float32)
        out["numpy"] = {"gflops": median_rate(lambda: np.matmul(a, b, out=c), n, repeats, min_time),
                        "blas": numpy_blas(np)}
        del limit
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        torch.set_num_threads(threads)
        a = torch.ones(n, n)
        b = torch.full((n, n), 0.5)
        c = torch.empty(n, n)
        blas = "MKL" if torch.backends.mkl.is_available() else "its BLAS"
        out["torch"] = {"gflops": median_rate(lambda: torch.mm(a, b, out=c), n, repeats, min_time),
                        "blas": f"{blas} in torch {torch.__version__}"}
    print(json.dumps(out))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()
