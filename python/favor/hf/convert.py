"""favor.hf.convert: a Hugging Face transformers model's attention replaced by favor's,
every trained weight kept.

    report = favor.hf.convert(model, "hedgehog", features=64)
    print(report)                              # one row per converted layer

Methods (favor.hf.METHODS; each takes the options of its core, below):
- exact: favor's exact softmax attention (the plumbing check: equals the original);
- favor: FAVOR+ (kernel positive by default; trig, hyperbolic; projection orthogonal
  (default), iid, radial, qmc, sorf, simplex, dct; norms; features m);
- favor++, favor#: FAVOR++ / FAVOR# (their fit comes from favor.hf.transfer);
- dijiang: DiJiang's weighted positive features on the DCT projection (lambda learned);
- hedgehog: the learned hedgehog map (W, b per head, 2m features);
- positive-fit: positive features with learned W, b and lambda;
- vq: Transformer-VQ (codes; codebooks by k-means on the first batch or in transfer).
Options of the favor methods: features (256), projection, norms, seed (0; layer i draws
with seed + i), decay (gamma per head or one; causal models only: a bidirectional layer
refuses it), learn_decay, feature_redraw_interval; of vq: codes (256), tau,
learn_codebook, seed. They are recorded in model.config.favor (save_pretrained keeps
them; favor.hf.from_pretrained reads them).
"""
from dataclasses import dataclass

import torch

from .. import _core
from ..torch.favor_core import FavorCore
from ..torch.vq_core import VQCore
from . import families
from .attention import NAME, pass_cache, register

# method -> the keywords of its core (favor's kernel is a default: trig or hyperbolic too)
METHODS = {
    "exact": dict(method="exact"),
    "favor": dict(),
    "favor++": dict(kernel="favorpp"),
    "favor#": dict(kernel="favorsharp"),
    "dijiang": dict(kernel="positive", projection="dct", feature_weights=True),
    "hedgehog": dict(kernel="hedgehog", learn_features=True),
    "positive-fit": dict(kernel="positive", learn_features=True, feature_weights=True),
    "vq": dict(),
}
_FAVOR_OPTIONS = ("kernel", "features", "projection", "norms", "seed", "decay", "learn_decay",
                  "feature_redraw_interval", "backend")
_VQ_OPTIONS = ("codes", "tau", "learn_codebook", "seed", "decay", "dead_after", "beta",
               "backend")  # backend: favor.torch's path (None: by the device; docs/gpu.md)


@dataclass
class LayerReport:
    name: str
    layer: int
    causal: bool
    heads: int
    kv_heads: int
    head_dim: int
    scale: float
    core: str


class ConversionReport(list):
    """The layers favor.hf.convert replaced (LayerReport rows), with the family and method."""

    def __init__(self, rows, family, model_type, method, options):
        super().__init__(rows)
        self.family, self.model_type, self.method, self.options = (family, model_type,
                                                                   method, options)

    def __str__(self):
        head = (f"favor.hf.convert: {len(self)} {self.model_type} attention layers -> "
                f"{self.method} {self.options}")
        rows = [f"  {r.name}: {'causal' if r.causal else 'bidirectional'}, {r.heads} heads "
                f"({r.kv_heads} kv), head_dim {r.head_dim}, scale {r.scale:.4g}: {r.core}"
                for r in self]
        return "\n".join([head, *rows])


def convert(model, method="favor", **options):
    """Replaces the attention of every layer of `model` (a transformers model of a family in
    favor.hf.FAMILIES) with favor `method` (module docstring), in place; returns a
    ConversionReport. The weights stay; each attention module gains `favor_core` (its
    tensors join the state_dict) and the model attends through favor ("favor" attention
    implementation). A decoder's generate() then keeps favor's decoder state per layer
    (favor.hf.FavorCache) instead of a key-value cache (method 'exact' keeps the cache)."""
    if method not in METHODS:
        raise _core.Error(f"method: {method!r} is not a favor.hf method; methods: "
                          f"{', '.join(METHODS)}")
    kind = families.model_type(model)
    config = model.config
    families.refusals(config, kind)
    allowed = _VQ_OPTIONS if method == "vq" else _FAVOR_OPTIONS
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise _core.Error(f"{unknown[0]}: not an option of method {method}; its options: "
                          f"{', '.join(allowed)}")
    heads, kv_heads, head_dim = families.shapes(config)
    modules = families.attention_modules(model, kind)
    _refuse_decay_without_causal_layers(method, options, modules)
    register()
    rows = []
    for i, (name, module) in enumerate(modules):
        causal = bool(getattr(module, "is_causal", False))
        scale = float(getattr(module, "scaling", head_dim ** -0.5))
        layer = getattr(module, "layer_idx", None)
        layer = i if layer is None else layer
        device = next(module.parameters()).device
        core = build_core(method, options, heads, head_dim, causal, scale, layer, device)
        module.favor_core = core
        rows.append(LayerReport(name, layer, causal, heads, kv_heads, head_dim, scale,
                                "exact softmax" if method == "exact" else core.extra_repr()))
    model.set_attn_implementation(NAME)
    # backend is this machine's choice, not the model's: not recorded
    config.favor = {"method": method, **{k: _plain(v) for k, v in options.items()
                                          if k != "backend"}}
    for _, module in modules:  # each layer's cache reaches its attention call (hf/cache.py)
        old = module.__dict__.pop("_favor_cache_hook", None)
        if old is not None:
            old.remove()
        module._favor_cache_hook = module.register_forward_pre_hook(pass_cache,
                                                                    with_kwargs=True)
    return ConversionReport(rows, families.FAMILY[kind], kind, method, options)


def _refuse_decay_without_causal_layers(method, options, modules):
    """decay / learn_decay of the favor methods weigh pair (i, j) by gamma^(i - j): causal
    attention only. A layer's causality is the family's (module.is_causal), fixed for every
    call, so on a bidirectional layer the decay would never apply: refused, before any layer
    is converted. (vq's decay is its codebook's moving average: every layer.)"""
    if method == "vq":
        return
    given = [key for key in ("decay", "learn_decay") if options.get(key) not in (None, False)]
    bidirectional = [name for name, m in modules if not getattr(m, "is_causal", False)]
    if given and bidirectional:
        raise _core.Error(f"{given[0]}: gamma^(i - j) weighs causal attention only, and "
                          f"{len(bidirectional)} of the model's {len(modules)} attention layers "
                          f"are bidirectional (the first: {bidirectional[0]}); convert without "
                          f"{given[0]}")


def build_core(method, options, heads, head_dim, causal, scale, layer, device):
    """The favor core of one layer: FavorCore (every method but vq) or VQCore."""
    options = dict(options)
    seed = options.pop("seed", 0) + layer
    if method == "vq":
        codes = options.pop("codes", 256)
        return VQCore(heads, head_dim, codes, causal=causal, scale=scale, seed=seed,
                      device=device, **options)
    kw = dict(METHODS[method])
    if method == "favor" and options.get("kernel") in ("favorpp", "favorsharp", "favor++",
                                                       "favor#", "hedgehog"):
        raise _core.Error(f"kernel: {options['kernel']} is a method of its own "
                          f"(favor.hf.convert(model, '{options['kernel']}'))")
    for key, value in options.items():
        if key in kw and kw[key] != value:
            raise _core.Error(f"{key}: method {method} uses {key}={kw[key]!r}")
        kw[key] = value
    return FavorCore(heads, head_dim, causal=causal, scale=scale, seed=seed, device=device, **kw)


def cores(model):
    """[(layer, attention module, its favor_core)] of a converted model, in layer order."""
    kind = families.model_type(model)
    found = [(m.layer_idx if getattr(m, "layer_idx", None) is not None else i, m, m.favor_core)
             for i, (_, m) in enumerate(families.attention_modules(model, kind))
             if getattr(m, "favor_core", None) is not None]
    if not found:
        raise _core.Error("model: not converted; call favor.hf.convert first")
    return found


def _plain(value):
    """A JSON-able copy of an option (lists of floats for tensors)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
