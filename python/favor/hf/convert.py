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
learn_codebook, seed. Each method is a Method record (favor/hf/methods.py: its core and
fixed keywords, options, decoding state, what transfer fits). The conversion is recorded in
model.config.favor as FavorConfig(method, options).to_dict(), plain JSON, so
model.save_pretrained keeps it and favor.hf.from_pretrained rebuilds the model from it.
"""
from dataclasses import dataclass

from .. import _core
from . import families
from .attention import NAME, pass_cache, register
from .methods import METHODS, SOFTMAX, FavorConfig  # noqa: F401  METHODS: favor.hf.METHODS


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
    ConversionReport. Every method also takes the per-layer plan: softmax_layers=[i, ...]
    keeps those layers on the model's own softmax attention (its mask, its implementation:
    softmax_attention, default the model's, e.g. "sdpa"; a key-value cache in generate()),
    the other layers on `method`. All layers listed: the original model, bit for bit. The
    weights stay; each attention module gains `favor_core` (its tensors join the state_dict)
    and the model attends through favor ("favor" attention implementation). A decoder's
    generate() then keeps favor's decoder state per layer (favor.hf.FavorCache) instead of
    a key-value cache (method 'exact' keeps the cache).
    model.config.favor records FavorConfig(method, options).to_dict()."""
    spec = FavorConfig(method, options)  # checks the method and its options
    record = spec.record
    family = families.family(model)
    config = model.config
    family.refuse(config)
    heads, kv_heads, head_dim = families.shapes(config)
    modules = family.attention_modules(model)
    _refuse_decay_without_causal_layers(record, options, modules)
    numbers = [_layer_number(i, m) for i, (_, m) in enumerate(modules)]
    outside = [i for i in spec.softmax_layers if i not in numbers]
    if outside:
        raise _core.Error(f"softmax_layers: {outside[0]} is not a layer of the model (its "
                          f"{len(modules)} attention layers are {numbers[0]}..{numbers[-1]})")
    if spec.softmax_layers:
        spec = FavorConfig(method, {**spec.options,
                                    "softmax_attention": softmax_attention(model, spec)})
    register()
    # every core built before any module changes: an option a core refuses leaves the model
    # as it was
    plan = []
    for (name, module), layer in zip(modules, numbers):
        causal = bool(getattr(module, "is_causal", False))
        scale = float(getattr(module, "scaling", head_dim ** -0.5))
        core = None
        if spec.layer_method(layer) != SOFTMAX:
            device = next(module.parameters()).device
            core = record.build(options, heads, head_dim, causal, scale, layer, device)
        plan.append((name, module, layer, causal, scale, core))
    own = getattr(config, "_attn_implementation", None)
    if own and own != NAME:  # what softmax layers run unless the plan names another
        model._favor_own_attention = own
    rows = []
    for name, module, layer, causal, scale, core in plan:
        if core is None:
            module.favor_core = None  # (a core of an earlier conversion leaves the state_dict)
            module.favor_state = None
            module.favor_softmax = spec.options["softmax_attention"]
            rows.append(LayerReport(name, layer, causal, heads, kv_heads, head_dim, scale,
                                    f"softmax ({module.favor_softmax}, the model's own)"))
            continue
        module.favor_core = core
        module.favor_state = record.state  # the decoding state its cache layer keeps
        module.favor_softmax = None
        rows.append(LayerReport(name, layer, causal, heads, kv_heads, head_dim, scale,
                                "exact softmax" if core.method == "exact"
                                else core.extra_repr()))
    model.set_attn_implementation(NAME)
    config.favor = spec.to_dict()  # plain JSON in config.json; FavorConfig.of(model) reads it
    for _, module in modules:  # each layer's cache reaches its attention call (hf/cache.py)
        old = module.__dict__.pop("_favor_cache_hook", None)
        if old is not None:
            old.remove()
        module._favor_cache_hook = module.register_forward_pre_hook(pass_cache,
                                                                    with_kwargs=True)
    return ConversionReport(rows, family.kind, family.model_type, method, options)


def _layer_number(i, module):
    layer = getattr(module, "layer_idx", None)
    return i if layer is None else layer


def softmax_attention(model, spec=None):
    """The attention implementation a softmax layer of `model` runs: the plan's
    softmax_attention, else the model's own (config._attn_implementation, or the one it had
    when first converted; "sdpa" for a model loaded converted), checked against
    transformers' attention and mask interfaces."""
    from transformers import AttentionInterface, AttentionMaskInterface
    name = None if spec is None else spec.options.get("softmax_attention")
    if name is None:
        name = getattr(model.config, "_attn_implementation", None) or "sdpa"
        if name == NAME:
            name = getattr(model, "_favor_own_attention", None) or "sdpa"
    known = [k for k in AttentionInterface._global_mapping
             if k in AttentionMaskInterface._global_mapping and k != NAME]
    if name != "eager" and name not in known:
        raise _core.Error(f"softmax_attention: {name!r} is not a transformers attention "
                          f"implementation a softmax layer can run (eager, {', '.join(known)})")
    return name


def _refuse_decay_without_causal_layers(record, options, modules):
    """decay / learn_decay of the favor methods weigh pair (i, j) by gamma^(i - j): causal
    attention only. A layer's causality is the family's (module.is_causal), fixed for every
    call, so on a bidirectional layer the decay would never apply: refused, before any layer
    is converted. (vq's decay is its codebook's moving average: every layer.)"""
    if not record.attention_decay:
        return
    given = [key for key in ("decay", "learn_decay") if options.get(key) not in (None, False)]
    bidirectional = [name for name, m in modules if not getattr(m, "is_causal", False)]
    if given and bidirectional:
        raise _core.Error(f"{given[0]}: gamma^(i - j) weighs causal attention only, and "
                          f"{len(bidirectional)} of the model's {len(modules)} attention layers "
                          f"are bidirectional (the first: {bidirectional[0]}); convert without "
                          f"{given[0]}")


def cores(model):
    """[(layer, attention module, its favor_core)] of a converted model, in layer order (the
    layers of its plan that run favor; softmax_layers have no core)."""
    modules = families.family(model).attention_modules(model)
    if not any(getattr(m, "favor_core", None) is not None or getattr(m, "favor_softmax", None)
               for _, m in modules):  # (config.favor alone: a plain load of a checkpoint)
        raise _core.Error("model: not converted; call favor.hf.convert first")
    return [(_layer_number(i, m), m, m.favor_core) for i, (_, m) in enumerate(modules)
            if getattr(m, "favor_core", None) is not None]
