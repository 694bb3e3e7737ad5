"""favor.torch.VQCore on its own, and the layers that own one (VQAttention,
VQMultiheadAttention): the core alone equals the layer's attention, compiles inside another
class, the core's attributes as the layer's, the state_dict keys, and loading a state_dict of
the flat layout from before the core (codebook, ema_sum, ...) or torch's MHA."""
import copy

import pytest
import torch
from torch import nn

import favor.torch as ft

CORE_TENSORS = ("codebook", "ema_sum", "ema_count", "unused", "initialised", "updates")
LAYERS = {
    "VQAttention": lambda **o: ft.VQAttention(16, 2, 5, **o),
    "VQMultiheadAttention": lambda **o: ft.VQMultiheadAttention(16, 2, batch_first=True,
                                                                codes=5, **o),
}


def _call(layer, x, pad=None):
    if isinstance(layer, ft.VQMultiheadAttention):
        return layer(x, x, x, key_padding_mask=pad, need_weights=False)[0]
    return layer(x, key_padding_mask=pad)


def _flat(state):
    """The state_dict as the layers wrote it before they owned a core."""
    return {k.replace("core.", ""): v for k, v in state.items()}


def _batches(steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    for s in range(steps):
        pad = torch.zeros(2, 9, dtype=torch.bool)
        pad[1, 6 + s:] = True
        yield torch.randn(2, 9, 16, generator=g), pad


@pytest.mark.parametrize("learn", ["ema", "grad"])
def test_core_alone_is_the_layers_attention(learn):
    """A copy of the layer's core, called alone on the layer's projected q, k, v, gives the
    layer's output, commitment loss and codebook state, bit for bit, over training steps
    (k-means on the first, EMA or dead-code reset on each)."""
    torch.manual_seed(0)
    layer = ft.VQAttention(16, 2, 5, causal=True, dead_after=1, learn_codebook=learn, seed=3)
    core = copy.deepcopy(layer.core)
    for x, pad in _batches(3):
        with torch.no_grad():
            q, k, v = (layer._heads(p(x)) for p in (layer.q_proj, layer.k_proj, layer.v_proj))
        want = layer(x, key_padding_mask=pad)
        got = layer.out_proj(layer._merge(core(q, k, v, key_padding_mask=pad)))
        assert torch.equal(got, want)
        assert torch.equal(core.commitment_loss, layer.commitment_loss)
        for name in CORE_TENSORS:
            assert torch.equal(getattr(core, name), getattr(layer, name)), name
        assert core.codes_reset == layer.codes_reset
    core.eval()
    want = ft.vq_attention(q, k, v, core.codebook, causal=True)
    assert torch.equal(core(q, k, v), want)
    assert torch.equal(core(q, k, v, causal=False),
                       ft.vq_attention(q, k, v, core.codebook, causal=False))


def test_core_in_another_attention_class_compiles_fullgraph():
    """What a Hugging Face attention class does: its own q/k/v projections, then the core;
    compiled in training mode (k-means on the first call, then EMA updates) it matches the
    eager class step for step."""

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(16, 48)
            self.core = ft.VQCore(2, 8, 5, causal=True, dead_after=1, seed=2)

        def forward(self, x):
            b, n, _ = x.shape
            q, k, v = self.qkv(x).view(b, n, 3, 2, 8).permute(2, 0, 3, 1, 4)
            return self.core(q, k, v).transpose(1, 2).reshape(b, n, 16)

    torch.manual_seed(0)
    eager = Attention()
    model = copy.deepcopy(eager)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    for x, _ in _batches(3):
        assert torch.equal(compiled(x), eager(x))
        assert torch.equal(model.core.commitment_loss, eager.core.commitment_loss)
        for name in CORE_TENSORS:
            assert torch.equal(getattr(model.core, name), getattr(eager.core, name)), name


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_layer_attributes_are_its_cores(layer):
    mod = LAYERS[layer](learn_codebook="grad", tau=0.5, decay=0.9, dead_after=7, beta=0.5,
                        scale=0.3, block=4, seed=6, kmeans_iterations=3)
    core = mod.core
    assert isinstance(core, ft.VQCore)
    for name in CORE_TENSORS + ("resets",):
        assert getattr(mod, name) is getattr(core, name), name
    for name, value in (("codes", 5), ("tau", 0.5), ("decay", 0.9), ("dead_after", 7),
                        ("beta", 0.5), ("scale", 0.3), ("block", 4), ("seed", 6),
                        ("kmeans_iterations", 3), ("learn_codebook", "grad"), ("method", "vq")):
        assert getattr(mod, name) == value == getattr(core, name), name
    mod.tau = 0.25
    mod.codes_reset = 3
    assert core.tau == 0.25 and "tau" not in mod.__dict__ and int(core.resets) == 3
    assert not hasattr(mod, "projection") and not hasattr(mod, "redraw")
    _call(mod, torch.randn(2, 9, 16))
    assert mod.commitment_loss is core.commitment_loss and mod.dead_codes() == core.dead_codes()
    assert {n for n, _ in mod.named_parameters() if n.startswith("core.")} == {"core.codebook"}
    assert {"core." + n for n in CORE_TENSORS} <= set(mod.state_dict())
    assert not any(k in mod.state_dict() for k in CORE_TENSORS)


@pytest.mark.parametrize("learn", ["ema", "grad"])
@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_flat_state_dict_of_the_earlier_layout_loads(layer, learn):
    """A state_dict with the keys the layers had before the core (codebook, ema_sum,
    ema_count, unused, initialised, updates) loads strictly into the new layer, bit for
    bit."""
    torch.manual_seed(0)
    trained = LAYERS[layer](causal=True, learn_codebook=learn, seed=1)
    for x, pad in _batches(2):
        _call(trained, x, pad)
    old = _flat(trained.state_dict())
    assert set(CORE_TENSORS) <= set(old)
    fresh = LAYERS[layer](causal=True, learn_codebook=learn, seed=2)
    fresh.load_state_dict(old)  # strict
    for k, v in trained.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k
    trained.eval()
    fresh.eval()
    x = torch.randn(2, 7, 16, generator=torch.Generator().manual_seed(3))
    assert torch.equal(_call(fresh, x), _call(trained, x))


def test_torch_multihead_state_loads_and_initialises_on_the_first_batch():
    """nn.MultiheadAttention's state_dict (no codebook) loads strictly; the core keeps its
    empty codebook until the first forward runs k-means."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 2, batch_first=True)
    mod = ft.VQMultiheadAttention(16, 2, batch_first=True, codes=5)
    mod.load_state_dict(mha.state_dict())  # strict
    assert torch.equal(mod.in_proj_weight, mha.in_proj_weight) and not bool(mod.initialised)
    _call(mod, torch.randn(2, 9, 16))
    assert bool(mod.initialised) and int(mod.updates) == 1


@pytest.mark.parametrize("shape", [(2, 7), (3, 10), (2, 1, 10)])
def test_a_key_padding_mask_of_the_wrong_shape_is_refused_before_anything_changes(shape):
    """A key_padding_mask that is not [B, Nk]: favor.Error (a ValueError) naming it and the
    rule, from the first call (before k-means would index the keys with it), and the core
    left as it was (its codebook not initialised)."""
    core = ft.VQCore(2, 8, codes=4, causal=True)
    q, k, v = (torch.randn(2, 2, 10, 8) for _ in range(3))
    before = {name: t.clone() for name, t in core.state_dict().items()}
    with pytest.raises(ValueError, match=r"key_padding_mask: shape \[.*\] must be \[B, Nk\] = "
                                         r"\[2,10\]"):
        core(q, k, v, key_padding_mask=torch.zeros(*shape, dtype=torch.bool))
    assert all(torch.equal(t, before[name]) for name, t in core.state_dict().items())
    core(q, k, v, key_padding_mask=torch.zeros(2, 10, dtype=torch.bool))  # the right one runs
    assert bool(core.initialised)
