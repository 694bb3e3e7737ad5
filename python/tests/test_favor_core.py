"""favor.torch.FavorCore on its own, and the layers that own one (FavorAttention,
MultiheadAttention): the core's attributes as the layer's, the state_dict keys, and loading a
state_dict of the flat layout from before the core (projection, map_weight, ...)."""
import os

import pytest
import torch
from torch import nn

import favor
import favor.torch as ft
from torch_helpers import qkv

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SHIPPED = os.path.join(ROOT, "examples", "shakespeare", "checkpoints", "exact.pt")
CORE_TENSORS = ("projection", "map_weight", "map_bias", "map_lambda", "decay_logit")


def _flat(state):
    """The state_dict as the layers wrote it before they owned a core."""
    return {k.replace("core.", ""): v for k, v in state.items()}


def test_core_alone_is_favor_attention_with_its_tensors():
    """forward on [B, H, N, D] is favor.torch.attention with the core's projection, map,
    decay and fit, bit for bit; causal=None takes the core's causal."""
    q, k, v = (t.float() for t in qkv(d=8, dv=8, seed=1))
    pad = torch.zeros(2, 12, dtype=torch.bool)
    pad[1, 9:] = True
    core = ft.FavorCore(2, 8, features=16, seed=4, kernel="hedgehog", learn_features=True,
                        feature_weights=True, causal=True, decay=[0.9, 0.8], learn_decay=True)
    with torch.no_grad():
        core.map_bias.add_(0.1)
    want = ft.attention(q, k, v, causal=True, kernel="hedgehog", projection=core.projection,
                        key_padding_mask=pad, weights=core.map_weight, bias=core.map_bias,
                        feature_weights=core.map_lambda, decay=core.gamma)
    assert torch.equal(core(q, k, v, key_padding_mask=pad), want)
    # a non-causal call runs without the decay
    plain = ft.attention(q, k, v, kernel="hedgehog", projection=core.projection,
                         weights=core.map_weight, bias=core.map_bias,
                         feature_weights=core.map_lambda)
    assert torch.equal(core(q, k, v, causal=False), plain)
    fpp = ft.FavorCore(2, 8, features=16, kernel="favorpp", fit=-0.05)
    want = ft.attention(q, k, v, kernel="favorpp", projection=fpp.projection,
                        fit=fpp.fit_tensors)
    assert torch.equal(fpp(q, k, v), want)


def test_core_forward_runs_the_redraw_policy():
    """A core used alone redraws as the layers do: every n-th training-mode call, draw i
    with seed + i; not in eval."""
    core = ft.FavorCore(1, 8, features=8, seed=3, feature_redraw_interval=2)
    q, k, v = (t.float() for t in qkv(h=1, d=8, dv=8))
    seen = []
    for _ in range(3):
        core(q, k, v)
        seen.append(core.projection.clone())
    assert torch.equal(seen[0], seen[1]) and not torch.equal(seen[1], seen[2])
    assert core.redraws == 1
    assert torch.equal(seen[2], torch.from_numpy(favor.Projection.draw(8, 8, seed=4).matrix.copy()))
    core.eval()
    for _ in range(4):
        core(q, k, v)
    assert core.redraws == 1


def test_core_in_another_attention_class_compiles_fullgraph():
    """What a Hugging Face attention class does: its own q/k/v projections, then the core."""

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(16, 48)
            self.core = ft.FavorCore(2, 8, features=16, causal=True)

        def forward(self, x):
            b, n, _ = x.shape
            q, k, v = self.qkv(x).view(b, n, 3, 2, 8).permute(2, 0, 3, 1, 4)
            return self.core(q, k, v).transpose(1, 2).reshape(b, n, 16)

    torch.manual_seed(0)
    model = Attention()
    x = torch.randn(2, 10, 16, generator=torch.Generator().manual_seed(1))
    want = model(x)
    torch._dynamo.reset()
    assert torch.equal(torch.compile(model, fullgraph=True, backend="aot_eager")(x), want)


@pytest.mark.parametrize("layer", ["FavorAttention", "MultiheadAttention"])
def test_layer_attributes_are_its_cores(layer):
    cls = getattr(ft, layer)
    mod = cls(16, 2, features=8, seed=5, kernel="hedgehog", learn_features=True,
              feature_weights=True)
    core = mod.core
    assert isinstance(core, ft.FavorCore)
    for name in CORE_TENSORS[:4]:
        assert getattr(mod, name) is getattr(core, name)
    assert mod.decay_logit is None and mod.decay is None and mod.gamma is None
    for name in ("kernel", "method", "scale", "seed", "norms", "projection_kind", "features",
                 "redraws", "feature_redraw_interval", "fit", "fit_tensors"):
        assert getattr(mod, name) == getattr(core, name), name
    mod.scale = 0.25
    mod.fit = None
    assert core.scale == 0.25 and "scale" not in mod.__dict__
    assert mod.feature_map().weights.shape == (2, 8, 8)
    with pytest.raises(AttributeError):
        mod.features = 3
    names = {n for n, _ in mod.named_parameters()}
    assert {"core.map_weight", "core.map_bias", "core.map_lambda"} <= names


@pytest.mark.parametrize("layer", ["FavorAttention", "MultiheadAttention"])
def test_flat_state_dict_of_the_earlier_layout_loads(layer):
    """A state_dict with the keys the layers had before the core (projection, map_weight,
    map_bias, map_lambda, decay_logit) loads strictly into the new layer, bit for bit."""
    cls = getattr(ft, layer)
    opts = dict(features=8, kernel="hedgehog", learn_features=True, feature_weights=True,
                decay=[0.9, 0.8], learn_decay=True, causal=True)
    torch.manual_seed(0)
    trained = cls(16, 2, seed=1, **opts)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.01 * torch.randn_like(p))
    old = _flat(trained.state_dict())
    assert {"projection", "map_weight", "map_bias", "map_lambda", "decay_logit"} <= set(old)
    fresh = cls(16, 2, seed=2, **opts)
    fresh.load_state_dict(old)  # strict
    for k, v in trained.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k
    x = torch.randn(2, 7, 16, generator=torch.Generator().manual_seed(3))
    if layer == "FavorAttention":
        assert torch.equal(fresh(x), trained(x))
    else:
        assert torch.equal(fresh(x, x, x, need_weights=False)[0],
                           trained(x, x, x, need_weights=False)[0])


def test_shipped_checkpoint_of_the_flat_layout_loads():
    """examples/shakespeare/checkpoints/exact.pt was written with the flat keys
    (blocks.i.attn.projection): load_model loads it strictly into core.projection."""
    from favor.models.training import load_model
    ck = torch.load(SHIPPED, map_location="cpu", weights_only=False)
    flat = [k for k in ck["model"] if k.endswith("attn.projection")]
    assert flat, "the shipped checkpoint has no flat projection keys any more"
    model, _ = load_model(SHIPPED)
    state = model.state_dict()
    for k in flat:
        new = k.replace("attn.projection", "attn.core.projection")
        assert torch.equal(state[new], ck["model"][k])


@pytest.mark.parametrize("window", [0, 6])
def test_save_causal_states_gives_the_recomputing_gradients_from_the_saved_context(
        monkeypatch, window):
    """save_causal_states=True (or the attribute): a causal call under autograd keeps its chunk
    states and rows (40 tokens: two 32-token chunks), the backward reads them (an
    AttentionContextView of the op's saved tensors, no copy) and gives the recomputing
    backward's gradients to rounding, for the map's parameters too; refused unless a bool."""
    from favor.ops.attention import op
    contexts = []
    real = op._call

    def recording(*args, **kwargs):
        if kwargs.get("dy") is not None:
            contexts.append(kwargs.get("context"))
        return real(*args, **kwargs)
    monkeypatch.setattr(op, "_call", recording)
    q, k, v = (t.detach().float() for t in qkv(n=40, d=8, dv=8, seed=3))
    grads = []
    for save in (False, True):
        torch.manual_seed(0)
        core = ft.FavorCore(2, 8, causal=True, features=16, learn_features=True,
                            feature_weights=True, window=window, sinks=1 if window else 0,
                            save_causal_states=save)
        ts = [t.clone().requires_grad_() for t in (q, k, v)]
        contexts.clear()
        (core(*ts) * torch.linspace(-1, 1, 2 * 2 * 40 * 8).reshape(2, 2, 40, 8)).sum().backward()
        assert len(contexts) == 1 and (contexts[0] is not None) == save
        grads.append([t.grad for t in ts] + [p.grad for p in core.parameters()])
    for plain, saved in zip(*grads):
        assert (saved - plain).norm() <= 1e-5 * plain.norm()
    with pytest.raises(ValueError, match="save_causal_states: 1 must be True or False"):
        ft.FavorCore(2, 8, save_causal_states=1)
