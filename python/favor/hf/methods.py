"""The methods favor.hf converts to, one Method record each (METHODS), and the typed record
of a conversion (FavorConfig) that config.json keeps.

A Method says which core a layer gets (favor.torch.FavorCore or VQCore) with which fixed
keywords, which options the caller may add, which decoding state a FavorCache keeps for it,
and what favor.hf.transfer fits. convert, transfer, finetune and from_pretrained read these
records; nothing else names a method.
"""
from dataclasses import dataclass, field

import torch

from .. import _core
from ..torch.favor_core import FavorCore
from ..torch.vq_core import VQCore

_FAVOR_OPTIONS = ("kernel", "features", "projection", "norms", "seed", "decay", "learn_decay",
                  "feature_redraw_interval", "window", "sinks", "gate", "backend")
_VQ_OPTIONS = ("codes", "tau", "learn_codebook", "seed", "decay", "dead_after", "beta",
               "backend")  # backend: favor.torch's path (None: by the device; docs/gpu.md)
_WINDOW_OPTIONS = ("window", "sinks", "backend")
_OWN_METHODS = ("favorpp", "favorsharp", "favor++", "favor#", "hedgehog")
# The per-layer plan, an option of every method: the layers that keep the model's own softmax
# attention (softmax_layers) and the attention implementation they run (softmax_attention,
# transformers' name: "sdpa", "eager", ...; default: the model's own when converted).
PLAN_OPTIONS = ("softmax_layers", "softmax_attention")
SOFTMAX = "softmax"  # the plan's name for a layer on the model's own attention

# What favor.hf.transfer does to a layer of the method (transfer._FITTERS):
FITS = {"nothing": "nothing to fit (exact)",
        "kernel": "the FAVOR++ / FAVOR# fit per head (favor.fit_kernel on q, k)",
        "maps": "the learned tensors (map, lambda, decay) by Adam against softmax",
        "codebook": "the codebooks by k-means on the layer's keys"}


def _decoder(core, batch):
    return core.decoder(batch)


@dataclass(frozen=True)
class Method:
    """One favor.hf method.

    name: its name in favor.hf.convert(model, name).
    core: the core class each layer gets (FavorCore or VQCore).
    fixed: the keywords of the core that the method fixes (an option may repeat one, not
        change it).
    options: the options convert takes for it ('backend' is the machine's, not recorded).
    state: the decoding state a FavorCache keeps per layer, state(core, batch) (the core's
        decoder), or None where generation keeps transformers' key-value cache (exact).
    fits: what transfer does to a layer (a key of FITS).
    needs_fit: the layer runs causally only once transfer has fitted it (FAVOR++ / FAVOR#).
    refused: {option: values that are methods of their own} (favor's kernel=hedgehog ...).
    """
    name: str
    core: type
    fixed: dict = field(default_factory=dict)
    options: tuple = _FAVOR_OPTIONS
    state: object = _decoder
    fits: str = "maps"
    needs_fit: bool = False
    refused: dict = field(default_factory=dict)

    def hybrid(self, options):
        """Whether a conversion with `options` is hybrid attention (a window or sinks)."""
        return bool(options.get("window") or options.get("sinks"))

    @property
    def learns(self):
        """Whether the method's core has a learned map (Parameters beyond a learned decay)."""
        return bool(self.fixed.get("learn_features") or self.fixed.get("feature_weights"))

    @property
    def attention_decay(self):
        """Whether its `decay` weighs attention by gamma^(i - j) (causal layers only); vq's
        decay is its codebook's moving average."""
        return self.core is FavorCore

    def check(self, options):
        """favor.Error for an option the method does not take or a value it refuses."""
        unknown = sorted(set(options) - set(self.options) - set(PLAN_OPTIONS))
        if unknown:
            raise _core.Error(f"{unknown[0]}: not an option of method {self.name}; its options: "
                              f"{', '.join(self.options)}")
        for key, values in self.refused.items():
            if options.get(key) in values:
                raise _core.Error(f"{key}: {options[key]} is a method of its own "
                                  f"(favor.hf.convert(model, '{options[key]}'))")
        for key, value in options.items():
            if key in self.fixed and self.fixed[key] != value:
                raise _core.Error(f"{key}: method {self.name} uses {key}={self.fixed[key]!r}")

    def build(self, options, heads, head_dim, causal, scale, layer, device):
        """The core of one layer: layer i draws with seed + i."""
        kw = {k: v for k, v in options.items() if k not in PLAN_OPTIONS}
        seed = kw.pop("seed", 0) + layer
        if self.core is VQCore:
            codes = kw.pop("codes", 256)
            return VQCore(heads, head_dim, codes, causal=causal, scale=scale, seed=seed,
                          device=device, **self.fixed, **kw)
        kw = {**self.fixed, **kw}
        if self.hybrid(kw) and kw.get("kernel") == "hedgehog":
            # hybrid hedgehog: the map [exp(Wx + b), exp(-Wx - b)] with the hyperbolic
            # estimator's norm term e^(-|x|^2/2) and constant (2m)^(-1/2), and a learned
            # mix factor lambda (LoLCATs learns one per head). Hedgehog's own form has no
            # norm term, so its estimate has no scale in common with the window's exact
            # terms: at SmolLM2's query norms it outweighs them by more than 1e8, beyond
            # what lambda or a gate can close. With the norm term the map starts as the
            # hyperbolic random-feature estimator of exp(q.k) (W the drawn projection,
            # b = 0): the exact terms' scale, so a gate starts it at the window.
            kw["kernel"] = "hyperbolic"
            kw.setdefault("feature_weights", True)
        core = FavorCore(heads, head_dim, causal=causal, scale=scale, seed=seed, device=device,
                         **kw)
        return core


METHODS = {m.name: m for m in [
    Method("exact", FavorCore, dict(method="exact"), state=None, fits="nothing"),
    # hybrid attention's window and sinks alone (the estimator removed): the baseline a
    # hybrid conversion must beat
    Method("window", FavorCore, dict(method="window"), options=_WINDOW_OPTIONS,
           fits="nothing"),
    Method("favor", FavorCore, refused={"kernel": _OWN_METHODS}),
    Method("favor++", FavorCore, dict(kernel="favorpp"), fits="kernel", needs_fit=True),
    Method("favor#", FavorCore, dict(kernel="favorsharp"), fits="kernel", needs_fit=True),
    Method("dijiang", FavorCore, dict(kernel="positive", projection="dct",
                                      feature_weights=True)),
    Method("hedgehog", FavorCore, dict(kernel="hedgehog", learn_features=True)),
    Method("positive-fit", FavorCore, dict(kernel="positive", learn_features=True,
                                           feature_weights=True)),
    Method("vq", VQCore, options=_VQ_OPTIONS, fits="codebook"),
]}


def method(name):
    """The Method record of `name`, or favor.Error naming the methods."""
    if not isinstance(name, str) or name not in METHODS:
        raise _core.Error(f"method: {name!r} is not a favor.hf method; methods: "
                          f"{', '.join(METHODS)}")
    return METHODS[name]


@dataclass(frozen=True)
class FavorConfig:
    """What a conversion was: the method and the options given to favor.hf.convert
    (backend aside: the machine's choice, not the model's). Checked by its Method record.
    model.config.favor holds to_dict() (plain JSON, so config.json keeps it); read it back
    with FavorConfig.of(model) or FavorConfig.from_dict(config.favor).

        {"method": "favor++", "features": 64, "seed": 0}
        {"method": "window", "window": 64, "sinks": 4, "softmax_layers": [7, 18, 20],
         "softmax_attention": "sdpa"}

    The per-layer plan (layer_method): the layers in softmax_layers keep the model's own
    softmax attention (implementation softmax_attention), every other layer the method.
    """
    method: str
    options: dict = field(default_factory=dict)

    def __post_init__(self):
        method(self.method).check(self.options)
        options = {k: _plain(v) for k, v in self.options.items() if k != "backend"}
        layers = _softmax_layers(options.pop("softmax_layers", None))
        attention = options.pop("softmax_attention", None)
        if attention is not None and (not isinstance(attention, str) or not attention):
            raise _core.Error(f"softmax_attention: {attention!r} must be the name of a "
                              "transformers attention implementation ('sdpa', 'eager', ...)")
        if layers:
            options["softmax_layers"] = layers
            if attention is not None:
                options["softmax_attention"] = attention
        object.__setattr__(self, "options", options)

    @property
    def softmax_layers(self):
        """The layers that keep the model's own softmax attention (a sorted tuple)."""
        return tuple(self.options.get("softmax_layers", ()))

    def layer_method(self, layer):
        """The plan of one layer: SOFTMAX ('softmax') or the method's name."""
        return SOFTMAX if layer in self.softmax_layers else self.method

    @property
    def core_options(self):
        """The options the method's cores take (the plan's options left out)."""
        return {k: v for k, v in self.options.items() if k not in PLAN_OPTIONS}

    @property
    def record(self):
        """The Method record."""
        return METHODS[self.method]

    def to_dict(self):
        return {"method": self.method, **self.options}

    @classmethod
    def from_dict(cls, spec):
        if isinstance(spec, cls):
            return spec
        if not isinstance(spec, dict) or "method" not in spec:
            raise _core.Error(f"config.favor: {spec!r} is not a favor conversion (a dict with "
                              "'method' and its options)")
        spec = dict(spec)
        return cls(spec.pop("method"), spec)

    @classmethod
    def of(cls, model):
        """The FavorConfig of a converted model (or of its config)."""
        config = getattr(model, "config", model)
        spec = getattr(config, "favor", None)
        if not spec:
            raise _core.Error("model: not converted; call favor.hf.convert first")
        return cls.from_dict(spec)


def _softmax_layers(layers):
    """softmax_layers checked: None or a list of distinct layer indices >= 0 -> sorted list.
    (Whether each is a layer of the model, convert checks.)"""
    if layers is None:
        return []
    if isinstance(layers, (str, bytes)) or not hasattr(layers, "__iter__"):
        raise _core.Error(f"softmax_layers: {layers!r} must be a list of layer indices")
    layers = list(layers)
    for i in layers:
        if isinstance(i, bool) or not isinstance(i, int) or i < 0:
            raise _core.Error(f"softmax_layers: {i!r} is not a layer index (an integer >= 0)")
    if len(set(layers)) != len(layers):
        twice = next(i for i in layers if layers.count(i) > 1)
        raise _core.Error(f"softmax_layers: layer {twice} is listed twice")
    return sorted(layers)


def _plain(value):
    """A JSON-able copy of an option (lists of floats for tensors)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
