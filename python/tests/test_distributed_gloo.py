"""favor.distributed over torch.distributed (gloo), each rank a subprocess
(distributed_worker.py: gloo through a file:// rendezvous in a temporary folder, no port
chosen by hand) with one thread, against single-process favor.torch.attention and
favor.torch.vq_attention on the whole sequence; and examples/distributed/train_split.py.

Every rank runs all of distributed_cases.py (and distributed_vq_cases.py) once per group
size; the tests below read the ranks' JSON results. A run that does not finish within
RUN_TIMEOUT (a hang) is killed and fails the tests that need it. Slices: 2 ranks 7 + 10
positions, 3 ranks 6 + 0 + 11 (an empty middle slice), 5 ranks 3 + 0 + 4 + 2 + 5 (deeper
scan trees). Tolerances: distributed_helpers.py.

Run: cd python/tests && PYTHONPATH=<build>/python python3 -m pytest -q test_distributed_gloo.py
"""
import json
import subprocess
import sys

import pytest

from distributed_cases import ATTENTION_CASES, ERROR_CASES
from distributed_helpers import HERE, check_case, check_error, env, wait_all
from distributed_vq_cases import VQ_CASES, VQ_ERROR_CASES

EXAMPLE = HERE.parents[1] / "examples" / "distributed" / "train_split.py"
SPLITS = {2: [7, 10], 3: [6, 0, 11]}
DEEP = (5, [3, 0, 4, 2, 5], ["exchange", "positive_causal", "mask", "decay_learned_causal",
                             "hedgehog_learned", "vq_hard_causal_mask", "vq_soft_mask_shared"])
_runs = {}


def _torch_run(tmp_path_factory, size, lengths, only=()):
    key = (size, tuple(only))
    if key not in _runs:
        d = tmp_path_factory.mktemp(f"gloo{size}")
        procs = [subprocess.Popen(
            [sys.executable, str(HERE / "distributed_worker.py"), str(r), str(size),
             ",".join(map(str, lengths)), str(d / "rendezvous"), str(d / f"rank{r}.json"),
             *only], cwd=HERE, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True) for r in range(size)]
        wait_all(procs, f"{size} gloo ranks")
        _runs[key] = [json.loads((d / f"rank{r}.json").read_text()) for r in range(size)]
    return _runs[key]


@pytest.mark.parametrize("size", sorted(SPLITS))
@pytest.mark.parametrize("case", ["exchange", *ATTENTION_CASES])
def test_gloo_slices_equal_single_process(tmp_path_factory, size, case):
    check_case(_torch_run(tmp_path_factory, size, SPLITS[size]), case, SPLITS[size])


@pytest.mark.parametrize("size", sorted(SPLITS))
@pytest.mark.parametrize("case", ERROR_CASES)
def test_gloo_bad_use_raises_the_same_error_on_every_rank(tmp_path_factory, size, case):
    check_error(_torch_run(tmp_path_factory, size, SPLITS[size]), f"error_{case}")


@pytest.mark.parametrize("size", sorted(SPLITS))
@pytest.mark.parametrize("case", VQ_CASES)
def test_gloo_vq_slices_equal_single_process(tmp_path_factory, size, case):
    check_case(_torch_run(tmp_path_factory, size, SPLITS[size]), case, SPLITS[size])


@pytest.mark.parametrize("size", sorted(SPLITS))
@pytest.mark.parametrize("case", VQ_ERROR_CASES)
def test_gloo_vq_bad_use_raises_the_same_error_on_every_rank(tmp_path_factory, size, case):
    check_error(_torch_run(tmp_path_factory, size, SPLITS[size]), f"vq_error_{case}",
                 "sequence-parallel VQ attention")


@pytest.mark.parametrize("case", DEEP[2])
def test_gloo_five_ranks(tmp_path_factory, case):
    size, lengths, only = DEEP
    check_case(_torch_run(tmp_path_factory, size, lengths, only), case, lengths)


def test_train_split_example_check(tmp_path):
    """The example trains 2 steps over 2 processes; --check compares its first step with a
    single process (loss and every gradient within 1e-4, measured ~2e-6)."""
    p = subprocess.Popen([sys.executable, str(EXAMPLE), "--procs", "2", "--steps", "2",
                          "--check", "--length", "1024"], cwd=tmp_path, env=env(),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = wait_all([p], "train_split.py")[0]
    assert "seed 0: 2 ranks, one window of 1024 characters" in out, out
    assert "tolerance 0.0001: OK" in out, out
    assert "step    2  loss" in out and "replicas identical" in out, out
