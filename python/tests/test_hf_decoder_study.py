"""Smoke test of examples/hf/decoder_study.py: the --quick mode (two methods, a few steps,
prompts of 256 and 512 characters) runs in a subprocess and writes results.json, the
markdown tables and the plot; the exact row equals the original's bits per character, and
FAVOR+'s decoder state has one size at both prompt lengths while the key-value cache grows."""
import json
import os
import subprocess

import pytest
from examples_python import examples_python

pytest.importorskip("transformers")
pytest.importorskip("matplotlib")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "examples", "hf", "decoder_study.py")
CHECKPOINT = os.path.join(ROOT, "examples", "hf", "char_llama", "model.safetensors")


@pytest.mark.skipif(not os.path.exists(CHECKPOINT), reason="no examples/hf/char_llama checkpoint")
def test_quick_decoder_study(tmp_path):
    python, env = examples_python()
    out = tmp_path / "out"
    proc = subprocess.run([python, SCRIPT, "--quick", "--no-progress", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in ("results.json", "decoder_study.md", "decoder_study.png"):
        assert (out / name).stat().st_size > 0, name
    res = json.loads((out / "results.json").read_text())
    acc = res["accuracy"]
    assert abs(acc["exact"]["converted"] - res["original_bpc"]) < 1e-3
    assert abs(acc["original (control)"]["converted"] - res["original_bpc"]) < 1e-3
    assert acc["favor"]["ft_last"] is not None
    gen = {(r["model"], r["context"]): r for r in res["generation"]}
    favor = [gen[("favor", c)]["cache_bytes"] for c in (256, 512)]
    kv = [gen[("original", c)]["cache_bytes"] for c in (256, 512)]
    assert favor[0] == favor[1] > 0
    assert kv[1] > kv[0] > 0
    md = (out / "decoder_study.md").read_text()
    assert "| exact |" in md and "| original | 512 |" in md
