"""Smoke test of examples/hf/decoder_study.py: the --quick mode (two methods, a few steps,
prompts of 256 and 512 characters), as docs/hf.md's block runs it (marker `checked-by:
test_hf_decoder_study.py`: test_docs.py leaves it to this file), writes results.json, the
markdown tables and the plot; the exact row equals the original's bits per character, and
FAVOR+'s decoder state has one size at both prompt lengths while the key-value cache grows."""
import json
import os

import pytest
from examples_python import run_block

pytest.importorskip("transformers")
pytest.importorskip("matplotlib")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECKPOINT = os.path.join(ROOT, "examples", "hf", "char_llama", "model.safetensors")


@pytest.mark.skipif(not os.path.exists(CHECKPOINT), reason="no examples/hf/char_llama checkpoint")
def test_quick_decoder_study(tmp_path):
    run_block("docs/hf.md", "examples/hf/decoder_study.py", __file__, tmp_path)
    out = tmp_path / "runs" / "decoder_study"
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
