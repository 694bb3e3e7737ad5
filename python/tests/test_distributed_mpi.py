"""favor.distributed over mpi4py (MPIExchange) under `mpirun -np 2`: every case of
distributed_cases.py and distributed_vq_cases.py against single-process favor.torch (each
rank is distributed_mpi_worker.py with one thread), and MPIExchange's free(), __del__ and the
shared operation and datatypes, also after MPI_Finalize. Skipped without mpirun or mpi4py.
Tolerances: distributed_helpers.py.

Run: cd python/tests && PYTHONPATH=<build>/python python3 -m pytest -q test_distributed_mpi.py
"""
import json
import shutil
import subprocess
import sys

import pytest

from distributed_cases import ATTENTION_CASES, ERROR_CASES
from distributed_helpers import HERE, check_case, check_error, env, wait_all
from distributed_vq_cases import VQ_CASES, VQ_ERROR_CASES


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
                         cwd=HERE, env=env(), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    out = wait_all([p], "mpirun -np 2")[0]
    results = [json.loads((tmp_path / f"rank.{r}.json").read_text()) for r in range(2)]
    # MPIExchange's free(), __del__ and the shared op and datatypes freed at exit, also after
    # MPI_Finalize, print nothing (an error in __del__ or atexit only prints)
    assert "Exception ignored" not in out and "Error in atexit" not in out, out[-3000:]
    for case in ["exchange", "mpi_free", *ATTENTION_CASES, *VQ_CASES]:
        check_case(results, case, lengths)
    for case in ERROR_CASES:
        check_error(results, f"error_{case}")
    for case in VQ_ERROR_CASES:
        check_error(results, f"vq_error_{case}", "sequence-parallel VQ attention")
