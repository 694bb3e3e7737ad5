"""favor.hf.longrange (copy recall, passkey, perplexity, agreement) and favor.hf.rank_layers /
softmax_at on tiny random models (hf_models.py).

The measures are checked against the loss computed here by hand; a model against itself
recovers exactly its own copy gain and agrees with itself everywhere. rank_layers: every
favor layer gets a row equal to the same measurement made inside softmax_at, and a greedy
search over every layer ends at the original (KL 0 exactly: every layer on softmax is the
original bit for bit, test_hf_softmax_layers.py).
"""
import copy
import math

import pytest
import torch

import favor
import favor.hf as fh
import favor.hf.longrange as lr
from hf_models import V, batches, make


def text(n=3000, seed=3):
    return torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(seed))


def four():
    return make("llama", num_hidden_layers=4)


def test_copy_batches_repeat_a_passage_after_other_text():
    ids = text()
    seqs = lr.copy_batches(ids, passage=20, gap=600, samples=3, seed=1)
    assert len(seqs) == 3
    for seq, start in seqs:
        assert seq.numel() == 640 and start == 620
        assert torch.equal(seq[:20], seq[620:])
    again = lr.copy_batches(ids, passage=20, gap=600, samples=3, seed=1)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(seqs, again))
    with pytest.raises(favor.Error, match="gap: 100 must be an integer >= 512"):
        lr.copy_batches(ids, gap=100)
    with pytest.raises(favor.Error, match="needs at least"):
        lr.copy_batches(ids[:500])


def test_copy_recall_is_the_loss_on_each_reading():
    model = four()
    ids = text()
    out = lr.copy_recall(model, ids, passage=16, gap=520, samples=2, reference=model)
    assert out["reference"]["gain"] == out["gain"]
    # a random model does not copy: a reference that gains nothing gives no fraction
    assert out["gain"] <= 0 and math.isnan(out["recovered"])
    first = second = 0.0
    for seq, start in lr.copy_batches(ids, passage=16, gap=520, samples=2):
        with torch.no_grad():
            logits = model(input_ids=seq[None]).logits[0]
        loss = torch.nn.functional.cross_entropy(logits[:-1], seq[1:], reduction="none")
        first += float(loss[:15].mean()) / 2
        second += float(loss[start:].mean()) / 2
    assert out["first"] == pytest.approx(first, rel=1e-6)
    assert out["second"] == pytest.approx(second, rel=1e-6)


def test_perplexity_and_agreement():
    model = four()
    ids = text()
    ppl = lr.perplexity(model, ids, lengths=(64, 128), windows=2)
    with torch.no_grad():
        logits = model(input_ids=ids[:64][None]).logits[0]
        one = torch.nn.functional.cross_entropy(logits[:-1], ids[1:64], reduction="sum")
        logits = model(input_ids=ids[64:128][None]).logits[0]
        two = torch.nn.functional.cross_entropy(logits[:-1], ids[65:128], reduction="sum")
    assert ppl[64] == pytest.approx(math.exp(float(one + two) / 126), rel=1e-6)
    assert lr.agreement(model, model, ids, length=64) == 1.0
    other = copy.deepcopy(model)
    fh.convert(other, "window", window=2, sinks=0)
    assert lr.agreement(other, model, ids, length=64) < 1.0
    with pytest.raises(favor.Error, match="longer than the text"):
        lr.perplexity(model, ids, lengths=(5000,))


class Digits:
    """A character tokenizer (ids = code points) for the passkey harness."""

    def __call__(self, s, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in s]}

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


class Reader(torch.nn.Module):
    """A 'model' whose greedy answer is the number after the prompt's last 'pass key is '
    inside the filler (honest=True), or a fixed wrong number. Its forward gives the answer
    (" " + key) probability SURE at each of its positions when honest; else the space
    probability 1/128 and each digit 1/10."""

    SURE = 0.9

    def __init__(self, honest):
        super().__init__()
        self.honest = honest
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.prompts = []

    def generate(self, ids, attention_mask=None, max_new_tokens=8, do_sample=False):
        prompt = "".join(chr(i) for i in ids[0].tolist())
        self.prompts.append(prompt)
        key = prompt.split("The pass key is ")[1][:5] if self.honest else "00000"
        return torch.cat([ids, torch.tensor([[ord(c) for c in " " + key + "."]])], 1)

    def forward(self, input_ids, use_cache=False):
        seq = "".join(chr(i) for i in input_ids[0].tolist())
        begin = seq.rindex(lr.QUESTION) + len(lr.QUESTION)  # the answer's first position
        answer = " " + seq.split("The pass key is ")[1][:5]
        logits = torch.zeros(1, len(seq), 128)
        for i, c in enumerate(answer):
            row = logits[0, begin - 1 + i]
            if self.honest:  # p(c) = e^a / (e^a + 127) = SURE
                row[ord(c)] = math.log(self.SURE * 127 / (1 - self.SURE))
            elif i > 0:
                row[:] = -math.inf
                row[ord("0"):ord("9") + 1] = 0.0
        return type("Out", (), {"logits": logits})()


def test_passkey_asks_for_the_key_at_each_depth():
    filler = torch.tensor([ord(c) for c in ("grass sky sun " * 400)])
    honest = Reader(True)
    out = lr.passkey(honest, Digits(), filler, lengths=(1024, 2048), depths=(0.1, 0.5, 0.9),
                     trials=2)
    assert out["overall"] == {1024: 1.0, 2048: 1.0}
    assert len(honest.prompts) == 12
    for prompt, depth in zip(honest.prompts[:6], (0.1, 0.1, 0.5, 0.5, 0.9, 0.9)):
        assert len(prompt) == 1024
        room = 1024 - len(lr.INTRO) - len(lr.NEEDLE.format(key="12345")) - len(lr.QUESTION)
        at = (prompt.index(lr.NEEDLE.split("{")[0]) - len(lr.INTRO)) / room
        assert abs(at - depth) < 1 / room
        assert prompt.endswith(lr.QUESTION)
    for n in (1024, 2048):  # the answer's loss, teacher forced
        assert out["nats"][n]["first"] == pytest.approx(-math.log(Reader.SURE), rel=1e-5)
        assert out["nats"][n]["rest"] == pytest.approx(-math.log(Reader.SURE), rel=1e-5)
    blind = lr.passkey(Reader(False), Digits(), filler, lengths=(1024,))
    assert blind["overall"][1024] == 0.0
    assert blind["nats"][1024]["first"] == pytest.approx(math.log(128), rel=1e-5)
    assert blind["nats"][1024]["rest"] == pytest.approx(math.log(10), rel=1e-5)
    assert "0% (2.30)" in lr.table({"blind": {"copy": {"recovered": 0.0, "second": 1.0},
                                              "passkey": blind, "perplexity": {64: 2.0}}})


def test_softmax_at_tries_a_plan_and_puts_the_model_back():
    teacher = four()
    student = copy.deepcopy(teacher)
    fh.convert(student, "window", window=2, sinks=1, softmax_layers=[3])
    ids = batches(1)[0]
    before = student(**ids).logits
    spec = dict(student.config.favor)
    with fh.softmax_at(student, [0, 1, 2]):
        assert torch.equal(student(**ids).logits, teacher(**ids).logits)
    assert student.config.favor == spec
    assert torch.equal(student(**ids).logits, before)
    with pytest.raises(favor.Error, match="3 is not a favor layer"):
        with fh.softmax_at(student, [3]):
            pass


def test_rank_layers_measures_every_layer_and_the_search_reaches_the_original():
    teacher = four()
    student = copy.deepcopy(teacher)
    fh.convert(student, "window", window=2, sinks=1)
    data = batches(2, n=24)
    recall = lr.copy_batches(text(), passage=8, gap=512, samples=1)
    report = fh.rank_layers(student, teacher, data, recall=recall, greedy=4, progress=False)
    assert report.by == "recall"
    assert sorted(r["layer"] for r in report.rows) == [0, 1, 2, 3]
    assert [r["recall"] for r in report.rows] == sorted(r["recall"] for r in report.rows)
    assert report.baseline["kl"] > 0
    row = next(r for r in report.rows if r["layer"] == 2)
    with fh.softmax_at(student, [2]):
        again = fh.rank_layers(student, teacher, data, progress=False).baseline
    assert again["kl"] == pytest.approx(row["kl"], rel=1e-6)
    assert row["kl_cut"] == pytest.approx(report.baseline["kl"] - row["kl"], rel=1e-9)
    assert [len(r["layers"]) for r in report.greedy] == [1, 2, 3, 4]
    assert report.greedy[-1]["kl"] == pytest.approx(0.0, abs=1e-6)
    assert "layer 2" in str(report)
    with pytest.raises(favor.Error, match="greedy: 5 must be an integer in"):
        fh.rank_layers(student, teacher, data, greedy=5, progress=False)
    with pytest.raises(favor.Error, match="by: 'recall'"):
        fh.rank_layers(student, teacher, data, by="recall", progress=False)


def test_the_command_line_refuses_a_missing_model_with_exit_2(tmp_path, capsys):
    f = tmp_path / "t.txt"
    f.write_text("hello")
    assert lr.main(["--model", str(tmp_path / "none"), "--text", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("favor.hf.longrange:") and len(err.strip().splitlines()) == 1
