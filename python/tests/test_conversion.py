"""favor.models.conversion and the conversion study on a tiny model: per-layer q/k/v capture,
every method family converts (FAVOR++/# with per-head fits from calibration text, learned
maps fitted by distillation) and streams generation that equals the forward; a per-head
KernelFit serves any batch; examples/shakespeare/study.py runs end to end and writes its
table.
"""
import json
import math
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import favor  # noqa: E402
from favor.models import bits_per_char  # noqa: E402
from favor.models.conversion import convert_method, layer_qkv, parse_method  # noqa: E402
from favor.models.training import TrainConfig, Trainer, load_model  # noqa: E402
from char_model_helpers import tiny_data, tiny_trainer  # noqa: E402
import forked_python  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.join(ROOT, "examples", "shakespeare")
TEXT = os.path.join(HERE, "data", "tinyshakespeare.txt")


@pytest.fixture(scope="module")
def data():
    return tiny_data()


@pytest.fixture(scope="module")
def trained(data):
    return tiny_trainer(data)[0]


def _calibration(data, model, n=8):
    return data.batch("train", n, model.context, torch.Generator().manual_seed(2))[0]


def test_layer_qkv_are_the_attention_inputs(trained, data):
    model = trained.model.eval()
    ids = _calibration(data, model, 3)
    qkv = layer_qkv(model, ids)
    outs = []
    hooks = [b.attn.register_forward_hook(lambda m, i, o: outs.append(o)) for b in model.blocks]
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    assert len(qkv) == len(model.blocks)
    for block, (q, k, v), y in zip(model.blocks, qkv, outs):
        a = block.attn
        assert q.shape == (3, a.num_heads, model.context, a.head_dim) and q.dtype == torch.float32
        s = (q @ k.transpose(-1, -2)) * a.head_dim ** -0.5
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
        ref = a.out_proj(a._merge(torch.softmax(s, -1) @ v))
        assert torch.allclose(ref, y, rtol=0, atol=1e-5)


def test_a_per_head_fit_serves_any_batch():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((3, 2, 40, 8)).astype(np.float32) * 0.5 for _ in range(3))
    fit = favor.fit_kernel("favorsharp", q[:1], k[:1])            # heads = 2
    assert fit.heads == 2
    tiled = favor.KernelFit(np.tile(np.asarray(fit.a), (3, 1)),
                            np.tile(np.asarray(fit.basis), (3, 1, 1)))
    for causal in (False, True):
        a = favor.attention(q, k, v, kernel="favorsharp", features=32, fit=fit, causal=causal)
        b = favor.attention(q, k, v, kernel="favorsharp", features=32, fit=tiled, causal=causal)
        assert np.array_equal(a, b)
    wrong = favor.fit_kernel("favorsharp", q[:, :1], k[:, :1])   # 3 entries for B*H = 6
    with pytest.raises(favor.Error, match="fit"):
        favor.attention(q, k, v, kernel="favorsharp", features=32, fit=wrong)


def _check_stream(model, prompt, n):
    ids, logits = model.generate(prompt, n, temperature=0, return_logits=True)
    full = model(ids[:, :-1])[:, prompt.shape[1] - 1:]
    assert torch.allclose(logits, full, rtol=0, atol=1e-4), (logits - full).abs().max()


@pytest.mark.parametrize("name", ["favorpp-32", "favorsharp-32", "hedgehog-16",
                                  "positive-fit-32", "wpff-32", "favor-iid-32", "vq-8"])
def test_every_family_converts_and_streams(trained, data, name):
    model = trained.model.eval()
    calib = _calibration(data, model)
    conv, info = convert_method(model, name, calib, fit_steps=30)
    family, size = parse_method(name)
    if family in ("favorpp", "favorsharp"):
        fits = [b.attn.fit for b in conv.blocks]
        assert all(f.heads == model.config["heads"] for f in fits)
        assert all(float(np.max(np.asarray(f.a))) < 0.125 for f in fits)
    if family in ("hedgehog", "positive-fit", "wpff"):
        for layer in info["layers"]:          # the fit lowers the held-out error
            assert layer["heldout_error_end"] < layer["heldout_error_start"]
        assert conv.blocks[0].attn.projection_kind == ("dct" if family == "wpff"
                                                        else "orthogonal")
    bpc = bits_per_char(conv, data, "val", count=4)
    assert math.isfinite(bpc) and bpc < 7
    # batch 2 (per-head fits repeated over the batch, in the decoders too)
    _check_stream(conv, data.windows("val", 6, 2)[0], 12)


def test_learned_maps_beat_favor_plus_right_after_conversion(trained, data):
    """On the tiny model too: the distilled map's output is closer to exact attention."""
    model = trained.model.eval()
    calib = _calibration(data, model)
    exact = bits_per_char(model, data, "val", count=8)
    plus, _ = convert_method(model, "favor-orth-32", calib)
    fitted, _ = convert_method(model, "positive-fit-32", calib, fit_steps=100)
    gap = lambda m: abs(bits_per_char(m, data, "val", count=8) - exact)
    assert gap(fitted) < gap(plus)


def test_checkpoints_keep_kernel_fits(trained, data, tmp_path):
    """A FAVOR# fit from calibration text is not a parameter: the checkpoint keeps it, and
    load_model / Trainer.resume put it back (without it the causal forward is refused)."""
    model = trained.model.eval()
    conv, _ = convert_method(model, "favorsharp-32", _calibration(data, model))
    t = Trainer(conv, data, TrainConfig(steps=2, batch=4), seed=0)
    t.train_step()
    path = str(tmp_path / "sharp.pt")
    t.save(path)
    x = data.windows("val", model.context, 2)[0]
    loaded, ck = load_model(path)
    assert len(ck["fits"]) == len(model.blocks)
    for a, b in zip(loaded.attentions(), conv.attentions()):
        assert np.array_equal(np.asarray(a.fit.basis), np.asarray(b.fit.basis))
    with torch.no_grad():
        assert torch.equal(loaded(x), conv.eval()(x))
    resumed = Trainer.resume(path, data)
    assert resumed.train_step() == t.train_step()
    # a method name converts on load, fitted to the calibration windows given
    trained.save(str(tmp_path / "base.pt"))
    by_name, _ = load_model(str(tmp_path / "base.pt"), "favorsharp-32", _calibration(data, model))
    fresh, _ = convert_method(model, "favorsharp-32", _calibration(data, model))
    with torch.no_grad():
        assert torch.equal(by_name(x), fresh.eval()(x))


def test_conversion_errors(trained):
    model = trained.model
    with pytest.raises(favor.Error, match="calibration"):
        convert_method(model, "favorsharp-32")
    with pytest.raises(favor.Error, match="calibration"):
        convert_method(model, "vq-8")
    with pytest.raises(favor.Error, match="preset"):
        convert_method(model, "favor-sideways-3")


def test_study_runs_end_to_end(trained, data, tmp_path):
    base = tmp_path / "tiny.pt"
    trained.save(str(base))
    out = tmp_path / "study"
    text = tmp_path / "text.txt"
    with open(TEXT, encoding="utf-8") as f:
        text.write_text(f.read()[:60000], encoding="utf-8")
    cmd = [os.path.join(HERE, "study.py"), "--baseline", str(base), "--out",
           str(out), "--only", "favor-orth-256,favorsharp-32,vq-8", "--fine-tune", "0.1",
           "--eval-windows", "2", "--scratch-steps", "4", "--jobs", "2", "--data", str(text)]
    r = forked_python.run(cmd)  # python study.py ...
    assert r.returncode == 0, r.stdout + r.stderr
    table = (out / "table.md").read_text()
    for m in ("favor-orth-256", "favorsharp-32", "vq-8"):
        res = json.loads((out / f"finetune-{m}.json").read_text())
        assert res["steps_20"] == 4 and res["steps_5"] == 2
        assert [s for s, _ in res["curve"]][0] == 0 and res["curve"][-1][0] == 4
        assert all(math.isfinite(b) for _, b in res["curve"])
        assert f"| {m} |" in table
    tuned, ck = load_model(str(out / "finetune-favorsharp-32.pt"))   # with its fits
    assert ck["step"] == 4 and ck["fits"] is not None
    assert math.isfinite(bits_per_char(tuned, data, "val", count=2))
    sc = json.loads((out / "scratch-favor-orth-256.json").read_text())
    assert sc["steps"] == 4 and math.isfinite(sc["bpc"])
    assert (out / "finetune.png").stat().st_size > 0
    # a second run finds every result and only rewrites the table
    r2 = forked_python.run(cmd)
    assert r2.returncode == 0 and "0 of 4 tasks to run" in r2.stdout


def test_a_per_head_fit_with_decay_trains_on_a_batch():
    """The feature-map path (decay) repeats a per-head FAVOR++ fit over the batch too."""
    import favor.torch as ft
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 2, 40, 8)).astype(np.float32)
    fit = favor.fit_kernel("favorpp", q, q)                       # heads = 2
    torch.manual_seed(0)
    m = ft.FavorAttention(16, 2, causal=True, kernel="favorpp", features=16, fit=fit,
                          decay=0.99)
    x = torch.randn(3, 10, 16, requires_grad=True)
    y = m(x)
    y.sum().backward()
    assert y.shape == (3, 10, 16) and torch.isfinite(x.grad).all()
    for i in range(3):                                             # each sample alone
        assert torch.allclose(m(x[i:i + 1].detach()), y[i:i + 1].detach(), rtol=0, atol=1e-5)
