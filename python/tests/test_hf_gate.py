"""The gated hybrid (convert's gate=True): a learned weight g per head on the estimated
terms under the one normaliser, started closed, so that a converted model starts at its
window + sinks model.

The output is y(g) = (W + g E) / (Z_w + g Z_e) (W, Z_w: the window and sinks' exact terms;
E, Z_e: the estimate's), so y(g) - y(0) = g Z_e (y_e - y_w) / (Z_w + g Z_e): linear in g
for small g. The tests check that shape, not a tolerance: the gap to the window model at
g = 1e-3 is 10x the gap at 1e-4 (to 1%), and at g = 1 the gated core is the ungated one.
"""
import copy

import pytest
import torch

import favor
import favor.hf as fh
from favor.torch import FavorCore
from hf_models import batches, generates_as_full_forward, inputs, make, run


def qkv(seed=0, n=40):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 4, n, 8, generator=g) for _ in range(3)]


def core(**kw):
    return FavorCore(4, 8, causal=True, features=16, window=4, sinks=1, seed=3, **kw)


def test_the_gate_starts_at_the_window_and_opens_linearly():
    q, k, v = qkv()
    window = FavorCore(4, 8, causal=True, method="window", window=4, sinks=1)(q, k, v)
    gaps = []
    for g in (1e-4, 1e-3):
        with torch.no_grad():
            gaps.append((core(gate=g)(q, k, v) - window).abs().max().item())
    assert gaps[0] > 0
    assert gaps[1] / gaps[0] == pytest.approx(10.0, rel=0.01)
    with torch.no_grad():  # g = 1: the plain hybrid (feature weights of 1 change nothing)
        torch.testing.assert_close(core(gate=1.0)(q, k, v), core()(q, k, v), rtol=0, atol=1e-6)


def test_the_gate_learns_from_its_closed_start():
    q, k, v = qkv()
    c = core(gate=True, learn_features=True, feature_weights=True)
    assert float(c.gate[0].detach()) == pytest.approx(1e-3)
    c(q, k, v).square().sum().backward()
    assert c.gate_log.grad is not None and bool((c.gate_log.grad != 0).all())
    c.gate_open = True
    torch.testing.assert_close(c.gate, torch.ones(4))


@pytest.mark.parametrize("kw,rule", [
    (dict(gate=True, window=0, sinks=0), "give window or sinks"),
    (dict(gate=2.0), "must be True or a starting weight in"),
    (dict(gate=0.0), "must be True or a starting weight in"),
    (dict(gate=True, kernel="favorpp"), "does not take"),
])
def test_a_gate_it_cannot_serve_is_refused(kw, rule):
    base = dict(window=4, sinks=1)
    base.update(kw)
    with pytest.raises(favor.Error, match=rule):
        FavorCore(4, 8, causal=True, features=16, **base)


@pytest.mark.parametrize("method", ["positive-fit", "hedgehog", "dijiang"])
def test_a_gated_conversion_starts_at_window_and_sinks_through_transfer(method):
    """For every learned method (hedgehog's hybrid map carries the norm term that puts its
    estimate on the exact terms' scale: without it the gate changed nothing, the gap to the
    window stayed at 3.2 for g = 1e-4 and 1e-5)."""
    original = make("llama", num_hidden_layers=4)
    window = copy.deepcopy(original)
    fh.convert(window, "window", window=4, sinks=1)
    model = copy.deepcopy(original)
    fh.convert(model, method, features=8, window=4, sinks=1, gate=1e-4)
    with pytest.raises(favor.Error, match="gate: not an option of method window"):
        fh.convert(copy.deepcopy(original), "window", window=4, gate=True)
    data = batches(2)
    start = {layer: list(g) for layer, g in fh.gates(model).items()}
    report = fh.transfer(model, data, steps=20, progress=False)
    assert fh.gates(model) == start  # transfer fits the estimator with the gate open
    assert all(r["error_after"] < r["error_before"] for r in report)
    ids, mask = inputs()
    gaps = []
    for g in (1e-4, 1e-5):  # the gap to the window model vanishes linearly with the gate
        with torch.no_grad():
            for _, _, c in fh.cores(model):
                c.gate_log.fill_(float(torch.tensor(g).log()))
        gaps.append((run(model, ids, mask) - run(window, ids, mask)).abs().max().item())
    assert gaps[0] / gaps[1] == pytest.approx(10.0, rel=0.02)


def test_distill_opens_the_gates_it_needs_and_they_are_saved(tmp_path):
    original = make("llama", num_hidden_layers=2)
    model = copy.deepcopy(original)
    fh.convert(model, "positive-fit", features=8, window=4, sinks=1, gate=True)
    fh.distill(model, original, batches(2, n=24), steps=6, lr=1e-3, gate_lr=0.2,
               progress=False, precision="float32")
    moved = [abs(g / 1e-3 - 1) for gs in fh.gates(model).values() for g in gs]
    assert max(moved) > 0.5  # six steps of 0.2 in log g move a gate by more than half
    ids, mask = inputs()
    before = run(model, ids, mask)
    fh.save_pretrained(model, tmp_path / "m")
    loaded = fh.from_pretrained(str(tmp_path / "m"), base=copy.deepcopy(original))
    assert fh.gates(loaded) == fh.gates(model)
    assert torch.equal(run(loaded, ids, mask), before)
    # generation's state carries the gate: greedy logits equal the full forward
    generates_as_full_forward(loaded, ids, mask, 5)
    with pytest.raises(favor.Error, match="gate_lr: 0 must be a number > 0"):
        fh.distill(model, original, batches(1), steps=1, gate_lr=0, progress=False)


def test_gates_needs_a_gated_model():
    model = make("llama")
    fh.convert(model, "favor", features=8, window=4)
    with pytest.raises(favor.Error, match="has no gates"):
        fh.gates(model)
