"""favor.hf.transfer (attention transfer, stage 1) and favor.hf.finetune (stage 2) on tiny
random models (hf_models.py): the fitted layers approach their softmax attention, a run is
deterministic and resumes from its checkpoint, FAVOR++/# and VQ get their fits and
codebooks, fine-tuning (whole model or LoRA, LM loss or a teacher) lowers its loss."""
import copy

import pytest
import torch

import favor
import favor.hf as fh
from hf_models import inputs, make, run


def _batches(family="llama", count=2):
    out = []
    for i in range(count):
        ids, mask = inputs(n=12, seed=10 + i, left=family != "bert")
        out.append(dict(input_ids=ids, attention_mask=mask))
    return out


def _maps(model):
    return [{n: t.detach().clone() for n, t in core.state_dict().items()}
            for _, _, core in fh.cores(model)]


@pytest.mark.parametrize("family,method,options", [
    ("llama", "hedgehog", dict(features=16)),
    ("bert", "positive-fit", dict(features=16)),
    ("gpt2", "dijiang", dict(features=16)),
])
def test_transfer_brings_each_layer_closer_to_its_softmax_attention(family, method, options):
    model = make(family)
    fh.convert(model, method, **options)
    report = fh.transfer(model, _batches(family), steps=60, lr=5e-2, progress=False)
    assert [r["layer"] for r in report] == [0, 1]
    for r in report:
        assert r["error_after"] < 0.8 * r["error_before"], r
    assert "Adam" in report[0]["fitted"]


def test_transfer_is_deterministic_and_resumes(tmp_path):
    base = make("llama")
    runs = []
    for _ in range(2):
        model = copy.deepcopy(base)
        fh.convert(model, "hedgehog", features=16, seed=3)
        fh.transfer(model, _batches(), steps=20, progress=False)
        runs.append(_maps(model))
    for a, b in zip(*runs):
        for name in a:
            assert torch.equal(a[name], b[name]), name
    other = copy.deepcopy(base)
    fh.convert(other, "hedgehog", features=16, seed=4)  # other starting maps
    fh.transfer(other, _batches(), steps=20, progress=False)
    assert not torch.equal(_maps(other)[0]["map_weight"], runs[0][0]["map_weight"])

    first = copy.deepcopy(base)
    fh.convert(first, "hedgehog", features=16, seed=3)
    fh.transfer(first, _batches(), steps=20, checkpoint=tmp_path, progress=False)
    (tmp_path / "layer1.pt").unlink()  # as if interrupted after layer 0
    resumed = copy.deepcopy(base)
    fh.convert(resumed, "hedgehog", features=16, seed=3)
    report = fh.transfer(resumed, _batches(), steps=20, checkpoint=tmp_path, progress=False)
    assert report[0].get("resumed") and not report[1].get("resumed")
    for a, b in zip(_maps(resumed), runs[0]):
        for name in a:
            assert torch.equal(a[name], b[name]), name
    with pytest.raises(favor.Error, match="checkpoint: .* holds a transfer"):
        fh.transfer(resumed, _batches(), steps=21, checkpoint=tmp_path, progress=False)


def test_transfer_fits_favorpp_favorsharp_and_vq_codebooks():
    for method in ("favor++", "favor#"):
        model = make("qwen2")
        fh.convert(model, method, features=32)
        ids, mask = inputs()
        with pytest.raises(favor.Error, match="needs AttentionOptions::fit"):
            run(model, ids, mask)  # causal: no fit to the sequence itself
        report = fh.transfer(model, _batches(), progress=False)
        assert all(core.fit is not None for _, _, core in fh.cores(model))
        assert all(r["error_after"] < 1.0 for r in report), report
        assert torch.isfinite(run(model, ids, mask)).all()
    model = make("gpt_neox")
    fh.convert(model, "vq", codes=8)
    fh.transfer(model, _batches(), progress=False)
    assert all(bool(core.initialised) for _, _, core in fh.cores(model))


def test_transfer_refuses_bad_arguments():
    model = make("llama")
    fh.convert(model, "hedgehog", features=16)
    with pytest.raises(favor.Error, match="steps: -1 must be an integer >= 0"):
        fh.transfer(model, _batches(), steps=-1)
    with pytest.raises(favor.Error, match="batches: give at least one"):
        fh.transfer(model, [])
    with pytest.raises(favor.Error, match="not converted"):
        fh.transfer(make("llama"), _batches())


@pytest.mark.parametrize("lora", [None, dict(r=4)])
def test_finetune_lowers_the_language_model_loss(lora):
    model = make("llama")
    fh.convert(model, "hedgehog", features=16)
    batches = _batches(count=1)
    losses = fh.finetune(model, batches, steps=15, lr=3e-3, lora=lora, progress=False)
    assert len(losses) == 15 and losses[-1] < losses[0]
    assert type(model).__name__ == "LlamaForCausalLM"  # adapters merged: a plain model again
    assert not any("lora" in n for n in model.state_dict())
    assert fh.cores(model)


def test_finetune_of_an_encoder_distils_against_the_teacher():
    teacher = make("bert")
    model = copy.deepcopy(teacher)
    fh.convert(model, "positive-fit", features=16)
    losses = fh.finetune(model, _batches("bert", 1), steps=15, lr=3e-3, teacher=teacher,
                         progress=False)
    assert losses[-1] < losses[0]
    with pytest.raises(favor.Error, match="no language-model head"):
        fh.finetune(model, _batches("bert", 1), steps=1)
