"""favor.hf.adapters: low-rank adapters (LoRA, through peft) kept beside a converted model's
unchanged weights, and the compact saved form they allow.

    favor.hf.add_adapters(model, r=8)          # peft LoRA layers on the attention projections
    favor.hf.distill(model, teacher, batches, steps=300, train="lora")
    favor.hf.save_pretrained(model, "adapter")                   # favor tensors + deltas, a few MB
    again = favor.hf.from_pretrained("adapter", base=original)   # on a freshly loaded original
    favor.hf.merge_adapters(model)             # deltas into the weights: a plain model again
    with favor.hf.merged(model): ...           # merged for a pass that does not train them

The compact form is three things: favor's tensors (every favor_core), the adapters' A and B,
and favor_adapter.json (the conversion's FavorConfig, the LoRA options, and a SHA-256 digest
of the base weights it was saved on). Loading checks the digest of the base it is given, so
an adapter never lands on another model's weights.
"""
import contextlib
import hashlib
import json
import os

import torch

from .. import _core
from . import families
from .convert import convert, cores

ADAPTER_JSON = "favor_adapter.json"
ADAPTER_TENSORS = "favor_adapter.safetensors"
FORMAT = 1
_OWN = (".favor_core.", "lora_")  # state_dict keys that are favor's or the adapters'


def add_adapters(model, **lora):
    """Injects peft LoRA layers (peft.inject_adapter_in_model) into a converted model: lora
    is peft.LoraConfig's options (r 8, lora_alpha 2r, lora_dropout 0, target_modules: the
    family's attention projections, Family.lora_targets). The base weights stay as they are
    (each wrapped layer keeps its original as base_layer); B starts at zero, so the model's
    outputs are unchanged. Returns the options used. A model with adapters already keeps
    them (the same options: returned; others: favor.Error)."""
    from peft import LoraConfig, inject_adapter_in_model
    cores(model)  # raises if not converted
    options = dict(lora)
    options.setdefault("r", 8)
    options.setdefault("lora_alpha", 2 * options["r"])
    options.setdefault("lora_dropout", 0.0)
    if "target_modules" not in options:
        options["target_modules"] = families.family(model).lora_targets(model)
    options["target_modules"] = sorted(options["target_modules"])
    have = adapter_options(model)
    if have is not None:
        if have != options:
            raise _core.Error(f"lora: the model has adapters with {have}; these are {options} "
                              "(merge_adapters first, or give the same options)")
        return have
    with torch.random.fork_rng(devices=[]):  # the caller's generator is left as it was
        torch.manual_seed(0)  # peft's A init draws: the same model gets the same adapters
        inject_adapter_in_model(LoraConfig(**options), model)
    model._favor_lora = options
    return options


def adapter_options(model):
    """The LoRA options of the adapters add_adapters gave `model`, or None."""
    return getattr(model, "_favor_lora", None)


def merge_adapters(model):
    """Adds each adapter's delta (B A scaled) into its base layer's weight and puts the base
    layer back in its place: a plain converted model again (its full save is
    model.save_pretrained). No-op without adapters."""
    from peft.tuners.lora import LoraLayer
    if adapter_options(model) is None:
        return model
    for name, module in list(model.named_modules()):
        if isinstance(module, LoraLayer):
            module.merge()
            parent, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, leaf, module.base_layer)
    del model._favor_lora
    return model


@contextlib.contextmanager
def merged(model):
    """With the model's adapters merged into their base layers' weights (one product a
    layer instead of three: evaluation, a teacher or any pass where the adapters do not
    train); at exit the adapters are unmerged and the base weights put back bit for bit.
    Without adapters: nothing changes."""
    from peft.tuners.lora import LoraLayer
    if adapter_options(model) is None:
        yield model
        return
    saved = []
    try:
        for module in model.modules():
            if isinstance(module, LoraLayer) and not module.merged:
                saved.append((module, module.base_layer.weight.data.clone()))
                module.merge()
        yield model
    finally:
        for module, weight in saved:
            module.base_layer.weight.data = weight
            module.merged_adapters.clear()


def base_digest(model):
    """SHA-256 of the model's own weights (every state_dict tensor that is not favor's or an
    adapter's; a LoRA-wrapped layer counts its base_layer), by name: equal for two models
    whose base weights are equal bit for bit."""
    h = hashlib.sha256()
    for name, t in sorted(_base_tensors(model).items()):
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def _base_tensors(model):
    return {k.replace(".base_layer.", "."): v for k, v in model.state_dict().items()
            if not any(own in k for own in _OWN)}


def _own_tensors(model):
    return {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()
            if any(own in k for own in _OWN)}


def save_compact(model, path, spec):
    """Writes favor's tensors, the adapters and favor_adapter.json (module docstring)."""
    from safetensors.torch import save_file
    os.makedirs(path, exist_ok=True)
    record = {"format": FORMAT, "favor": spec.to_dict(), "lora": adapter_options(model),
              "base": {"architecture": type(model).__name__,
                       "model_type": getattr(model.config, "model_type", None),
                       "sha256": base_digest(model)}}
    tmp = os.path.join(path, ADAPTER_TENSORS + ".tmp")
    save_file(_own_tensors(model), tmp)
    os.chmod(tmp, 0o644)  # safetensors writes 0600; a shared model folder is readable
    os.replace(tmp, os.path.join(path, ADAPTER_TENSORS))
    tmp = os.path.join(path, ADAPTER_JSON + ".tmp")
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1)
    os.replace(tmp, os.path.join(path, ADAPTER_JSON))


def is_compact(path):
    return os.path.isfile(os.path.join(path, ADAPTER_JSON))


def load_compact(path, base):
    """base (a freshly loaded original, not converted) converted and given the saved favor
    tensors and adapters, in place; favor.Error if its weights are not those it was saved on."""
    from safetensors.torch import load_file
    from .methods import FavorConfig
    with open(os.path.join(path, ADAPTER_JSON)) as f:
        record = json.load(f)
    if record.get("format") != FORMAT:
        raise _core.Error(f"path: {path} has favor adapter format {record.get('format')}; this "
                          f"favor.hf reads format {FORMAT}")
    if getattr(getattr(base, "config", None), "favor", None):
        raise _core.Error("base: already converted; give the original model, freshly loaded")
    saved = record["base"]
    if type(base).__name__ != saved["architecture"]:
        raise _core.Error(f"base: a {type(base).__name__}; the adapter at {path} was saved on a "
                          f"{saved['architecture']}")
    if base_digest(base) != saved["sha256"]:
        raise _core.Error(f"base: its weights differ from those the adapter at {path} was saved "
                          "on (SHA-256 of the base weights); load the same original model, "
                          "unchanged")
    spec = FavorConfig.from_dict(record["favor"])
    convert(base, spec.method, **spec.options)
    if record.get("lora"):
        add_adapters(base, **record["lora"])
    tensors = load_file(os.path.join(path, ADAPTER_TENSORS))
    result = base.load_state_dict(tensors, strict=False)
    missing = [k for k in result.missing_keys if any(own in k for own in _OWN)]
    if result.unexpected_keys or missing:
        raise _core.Error(f"path: the adapter's tensors do not fit this {type(base).__name__} "
                          f"(unexpected {result.unexpected_keys[:3]}, missing {missing[:3]})")
    base.eval()
    return base
