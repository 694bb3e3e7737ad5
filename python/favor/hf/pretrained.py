"""save_pretrained / from_pretrained of a model converted by favor.hf.convert, in full or
in the compact form of hf/adapters.py (favor's tensors and LoRA deltas on an unchanged base).

model.save_pretrained(path) writes everything: the favor tensors of every favor_core
(projection, learned map, decay, codebooks and the FAVOR++ / FAVOR# fit, fit_a and
fit_basis) with the weights, and the conversion in config.json ("favor":
FavorConfig(method, options).to_dict()). save_pretrained(model, path) is that call, on a
converted model. from_pretrained(path) rebuilds the model class named in the config,
converts its module structure with the recorded FavorConfig and loads the favor tensors:
nothing is re-fitted, and the outputs are the saved model's bit for bit. A checkpoint of an
earlier favor.hf whose fits are in favor_fits.safetensors still loads (the file fills the
fits the state_dict lacks).

A favor checkpoint loaded by transformers alone (LlamaForCausalLM.from_pretrained(path),
AutoModel*.from_pretrained(path)) is the softmax model with favor's tensors left out: once
favor.hf is imported, that load warns (a UserWarning naming favor.hf.from_pretrained).
"""
import functools
import glob
import os
import warnings

from .. import _core
from . import adapters
from .convert import convert, cores
from .methods import FavorConfig

LEGACY_FITS = "favor_fits.safetensors"  # where an earlier favor.hf.save_pretrained put fits


def save_pretrained(model, path, compact=None, **kwargs):
    """Saves a converted model. Full (compact False): model.save_pretrained(path, **kwargs),
    the fits in its state_dict. Compact (True): favor's tensors, the LoRA adapters of
    add_adapters / distill / finetune(keep_adapters=True) and favor_adapter.json, a few MB,
    which from_pretrained(path, base=original) puts back on a freshly loaded original (the
    base weights must be the original's: the load checks their digest). compact=None: compact
    when the model has adapters (a full save cannot hold them unmerged: merge_adapters
    first), else full."""
    cores(model)  # raises if not converted
    has = adapters.adapter_options(model) is not None
    if compact is None:
        compact = has
    if compact:
        if kwargs:
            raise _core.Error(f"{sorted(kwargs)[0]}: an option of the full save; the compact "
                              "save takes none")
        adapters.save_compact(model, path, FavorConfig.of(model))
        return
    if has:
        raise _core.Error("compact: False, but the model has LoRA adapters, which a full save "
                          "cannot hold; call favor.hf.merge_adapters(model) first")
    model.save_pretrained(path, **kwargs)


def from_pretrained(path, model_class=None, *, base=None, **kwargs):
    """The converted model saved at `path` by save_pretrained. A full save: model_class
    (default: the transformers class named in config.architectures) loaded from path,
    converted with config.favor (a FavorConfig), its favor tensors and fits loaded; kwargs
    go to from_pretrained. A compact save: `base`, the original model freshly loaded (the
    one the adapter was saved on; its weights' digest is checked), converted in place and
    given favor's tensors and the adapters; returns it. `path` is a local directory (a model
    on the hub: download it first, e.g. with huggingface_hub.snapshot_download)."""
    import transformers
    from safetensors.torch import load_file
    if not os.path.isdir(path):
        what = "is not a directory" if os.path.exists(path) else "does not exist"
        raise _core.Error(f"path: {os.fspath(path)!r} {what} (favor.hf.from_pretrained "
                          "loads the directory that save_pretrained wrote; a model on the hub: "
                          "download it first, e.g. with huggingface_hub.snapshot_download)")
    if adapters.is_compact(path):
        if base is None:
            raise _core.Error(f"base: {path} holds a compact favor adapter; give base=, the "
                              "original model it was saved on, freshly loaded")
        if model_class is not None or kwargs:
            raise _core.Error("model_class: a compact adapter loads onto base=; give no class "
                              "or load options")
        return adapters.load_compact(path, base)
    if base is not None:
        raise _core.Error(f"base: {path} is a full save, which needs no base; call "
                          "from_pretrained(path) without it")
    config = transformers.AutoConfig.from_pretrained(path)
    if not getattr(config, "favor", None):
        raise _core.Error(f"path: {path} holds no favor model (config.json has no 'favor'); "
                          "load it with transformers and call favor.hf.convert")
    spec = FavorConfig.of(config)
    if model_class is None:
        names = getattr(config, "architectures", None) or []
        if not names or not hasattr(transformers, names[0]):
            raise _core.Error(f"model_class: config.architectures is {names}; give the class")
        model_class = getattr(transformers, names[0])
    model = _loader(model_class).from_pretrained(path, **kwargs)
    model.__class__ = model_class
    convert(model, spec.method, **spec.options)
    tensors = {}
    for f in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        if os.path.basename(f) != LEGACY_FITS:
            tensors.update({k: v for k, v in load_file(f).items() if ".favor_core." in k})
    incompatible = model.load_state_dict(tensors, strict=False)
    if incompatible.unexpected_keys:
        raise _core.Error(f"path: favor tensors {incompatible.unexpected_keys[:3]} do not fit "
                          f"this {type(model).__name__}")
    legacy = os.path.join(path, LEGACY_FITS)
    if os.path.exists(legacy):
        saved = load_file(legacy)
        for layer, _, core in cores(model):
            if f"{layer}.a" in saved and getattr(core, "fit", None) is None:
                core.fit = _core.KernelFit(saved[f"{layer}.a"].numpy(),
                                           saved[f"{layer}.basis"].numpy())
    model.eval()
    return model


_FAVOR_TENSORS = r"\.favor_core\."  # the state_dict keys of every favor_core (convert)


def _loader(model_class):
    """model_class with favor's tensors among the keys its from_pretrained expects to be
    unexpected (transformers' _keys_to_ignore_on_load_unexpected): the model is loaded
    before convert gives it its favor_core modules, and the load report then lists only the
    keys that are unexpected for the converted model too. It adds nothing else; the loaded
    model gets model_class back as its class."""
    ignore = [*(model_class._keys_to_ignore_on_load_unexpected or ()), _FAVOR_TENSORS]
    return type(model_class.__name__, (model_class,),
                {"__module__": model_class.__module__, "__qualname__": model_class.__qualname__,
                 "_keys_to_ignore_on_load_unexpected": ignore, "_favor_loader": True})


def _warn_if_favor_dropped(cls, model, path):
    """A UserWarning when transformers' from_pretrained (not favor.hf.from_pretrained) loaded
    a favor checkpoint: config.favor is there, but no layer has its favor_core."""
    spec = getattr(getattr(model, "config", None), "favor", None)
    if not spec or getattr(cls, "_favor_loader", False) or not hasattr(model, "modules"):
        return
    if any(getattr(m, "favor_core", None) is not None for m in model.modules()):
        return
    method = spec.get("method") if isinstance(spec, dict) else spec  # not checked: a warning
    where = repr(os.fspath(path)) if isinstance(path, (str, os.PathLike)) else "path"
    warnings.warn(f"{cls.__name__}.from_pretrained: {where} is a favor checkpoint (favor.hf "
                  f"method {method!r}); transformers dropped favor's attention and its "
                  "tensors, so this model runs softmax attention. Load it with "
                  f"favor.hf.from_pretrained({where}).", UserWarning, stacklevel=3)


def _watch_plain_loads():
    """Makes transformers' PreTrainedModel.from_pretrained warn after loading a favor
    checkpoint without favor (_warn_if_favor_dropped); idempotent. Only the model it
    returns is looked at: the load itself is transformers' own."""
    from transformers import PreTrainedModel
    plain = PreTrainedModel.__dict__["from_pretrained"].__func__
    if getattr(plain, "_favor_watch", False):
        return

    @functools.wraps(plain)
    def from_pretrained(cls, *args, **kwargs):
        loaded = plain(cls, *args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded  # output_loading_info
        path = args[0] if args else kwargs.get("pretrained_model_name_or_path")
        _warn_if_favor_dropped(cls, model, path)
        return loaded

    from_pretrained._favor_watch = True
    PreTrainedModel.from_pretrained = classmethod(from_pretrained)


_watch_plain_loads()
