"""The measurement scripts of examples/shakespeare on the shipped checkpoint, small: dump_qkv
writes each layer's attention inputs, accuracy_table runs favor accuracy on them and
tabulates every method per layer, decode_speed times streamed tokens for exact and favor
(the favor state stays the same size, the exact cache grows)."""
import json
import os

import numpy as np
import pytest

import forked_python

torch = pytest.importorskip("torch")
from favor.models import CharData  # noqa: E402
from favor.models.conversion import layer_qkv  # noqa: E402
from favor.models.training import load_model  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.join(ROOT, "examples", "shakespeare")
SHIPPED = os.path.join(HERE, "checkpoints", "exact.pt")


def run(script, *args):
    """`python SCRIPT ARGS`, forked from an interpreter with torch and favor imported
    (forked_python.py)."""
    r = forked_python.run([os.path.join(HERE, script), *args])
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@pytest.fixture(scope="module")
def qkv(tmp_path_factory):
    out = tmp_path_factory.mktemp("qkv")
    run("dump_qkv.py", SHIPPED, "--out", str(out), "--windows", "2", "--length", "64",
        "--threads", "1")
    return out


def test_dump_qkv_writes_every_layer(qkv):
    model, ck = load_model(SHIPPED)
    meta = json.loads((qkv / "meta.json").read_text())
    assert meta["layers"] == 4 and meta["shape"] == [2, 4, 64, 32]
    data = CharData.from_file(os.path.join(HERE, "data", "tinyshakespeare.txt"),
                              chars=ck["chars"])
    ids, _ = data.windows("val", 64, 2)
    assert meta["first_window"] == data.decode(ids[0])
    # On one thread, as the script ran (--threads 1): torch's kernels give other bits on
    # another thread count (AVX2's do: docs/reliability.md, "Other CPUs on this one").
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        layers = layer_qkv(model, ids)
    finally:
        torch.set_num_threads(threads)
    for i, (q, k, v) in enumerate(layers):
        for name, t in (("q", q), ("k", k), ("v", v)):
            a = np.load(qkv / f"layer{i}_{name}.npy")
            assert a.dtype == np.float32 and np.array_equal(a, t.numpy())


@pytest.mark.parametrize("mode", ["bidirectional", "causal"])
def test_accuracy_table_covers_every_method_per_layer(qkv, mode):
    cli = os.environ.get("FAVOR_CLI")
    if not cli:
        pytest.skip("FAVOR_CLI (the favor executable) is set by ctest")
    extra = ["--causal"] if mode == "causal" else []
    out = run("accuracy_table.py", str(qkv), "--favor", cli, "--features", "16",
              "--projections", "orthogonal", "--seeds", "1", "--maps-steps", "5", *extra)
    table = (qkv / f"accuracy_{mode}.md").read_text()
    assert table in out and "| method | layer 0 | layer 1 | layer 2 | layer 3 | mean |" in table
    assert f"{mode} attention" in table
    for row in ("positive / orthogonal", "trig / orthogonal",
                "favorsharp / orthogonal (in-sample fit)", "hedgehog (distilled",
                "wpff (distilled", "favor# (in-sample fit", "vq hard"):
        line = next(x for x in table.splitlines() if x.startswith(f"| {row}"))
        cells = [float(c) for c in line.strip("|").split("|")[1:]]
        assert len(cells) == 5 and all(c >= 0 for c in cells), line
    for layer in range(4):
        res = json.loads((qkv / f"accuracy_{mode}_layer{layer}.json").read_text())
        assert res["meta"]["causal"] == (mode == "causal")


def test_decode_speed_runs_and_favor_state_stays_flat(tmp_path):
    out = tmp_path / "decode.json"
    text = run("decode_speed.py", "--length", "300", "--bin", "64", "--threads", "1",
               "--out", str(out), "--plot", str(tmp_path / "decode.png"))
    assert "exact / favor-orth-256 at position" in text
    res = json.loads(out.read_text())["results"]
    for name in ("exact", "favor-orth-256"):
        assert len(res[name]["times"]) == 300 - len("ROMEO:")
        assert all(t > 0 for t in res[name]["times"])
    fav = list(res["favor-orth-256"]["sizes"].values())
    exact = list(res["exact"]["sizes"].values())
    assert len(set(fav)) == 1 and exact == sorted(exact) and exact[-1] > exact[0]
    assert (tmp_path / "decode.png").stat().st_size > 0


def test_evaluate_and_generate_the_shipped_checkpoint():
    """The two documented commands of a fresh clone (fewer windows and characters)."""
    out = run("evaluate.py", SHIPPED, "--windows", "4", "--threads", "1")
    bpc = float(out.split("val_bpc ")[1].split()[0])
    assert 1.0 < bpc < 2.6, out
    args = ("generate.py", SHIPPED, "--prompt", "ROMEO:", "-n", "60", "--seed", "0",
            "--threads", "1")
    a, b = run(*args), run(*args)
    assert a == b and a.startswith("ROMEO:") and len(a.rstrip("\n")) >= 66
    c = run(*args, "--attention", "favorsharp-64")
    assert c.startswith("ROMEO:") and c != a


def test_train_resume_convert_and_evaluate(tmp_path):
    """train.py on the tiny preset (checkpoint every 3 steps), --resume continues it, --init
    converts it to a fitted FAVOR# and fine-tunes, and evaluate.py reads the result with its
    fits."""
    base = str(tmp_path / "tiny.pt")
    out = run("train.py", "--model", "tiny", "--steps", "6", "--eval-every", "3",
              "--eval-windows", "2", "--batch", "4", "--out", base, "--threads", "1")
    assert "step 6 train_loss" in out and "seed 0" in out
    out = run("train.py", "--resume", "--out", base, "--steps", "6", "--threads", "1")
    assert "resumed" in out and "at step 6/6" in out
    ft = str(tmp_path / "ft.pt")
    out = run("train.py", "--init", base, "--attention", "favorsharp-32", "--steps", "2",
              "--eval-every", "2", "--eval-windows", "2", "--batch", "4", "--out", ft,
              "--threads", "1")
    assert "step 2 train_loss" in out
    assert torch.load(ft, weights_only=False)["fits"] is not None
    out = run("evaluate.py", ft, "--windows", "2", "--threads", "1")
    assert "favorsharp" in out and "val_bpc" in out
