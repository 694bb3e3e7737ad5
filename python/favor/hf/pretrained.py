"""save_pretrained / from_pretrained of a model converted by favor.hf.convert.

model.save_pretrained(path) already writes the favor tensors (every favor_core's
projection, learned map, decay, codebooks) with the weights and the method in
config.json ("favor"); save_pretrained(model, path) adds the FAVOR++ / FAVOR# fits
(favor_fits.safetensors). from_pretrained(path) rebuilds the model class named in the
config, converts it with the recorded method and loads the favor tensors and fits.
"""
import glob
import os

import numpy as np
import torch

from .. import _core
from .convert import convert, cores

FITS = "favor_fits.safetensors"


def save_pretrained(model, path, **kwargs):
    """model.save_pretrained(path, **kwargs) and the fits of its FAVOR++ / FAVOR# layers."""
    from safetensors.torch import save_file
    cores(model)  # raises if not converted
    model.save_pretrained(path, **kwargs)
    fits = {}
    for layer, _, core in cores(model):
        fit = getattr(core, "fit", None)
        if fit is not None:
            fits[f"{layer}.a"] = torch.from_numpy(np.ascontiguousarray(fit.a))
            fits[f"{layer}.basis"] = torch.from_numpy(np.ascontiguousarray(fit.basis))
    if fits:
        save_file(fits, os.path.join(path, FITS))


def from_pretrained(path, model_class=None, **kwargs):
    """The converted model saved at `path` (save_pretrained): model_class (default: the
    transformers class named in config.architectures) loaded from path, converted with
    config.favor, its favor tensors and fits loaded. kwargs go to from_pretrained."""
    import transformers
    from safetensors.torch import load_file
    config = transformers.AutoConfig.from_pretrained(path)
    spec = getattr(config, "favor", None)
    if not spec:
        raise _core.Error(f"path: {path} holds no favor model (config.json has no 'favor'); "
                          "load it with transformers and call favor.hf.convert")
    if model_class is None:
        names = getattr(config, "architectures", None) or []
        if not names or not hasattr(transformers, names[0]):
            raise _core.Error(f"model_class: config.architectures is {names}; give the class")
        model_class = getattr(transformers, names[0])
    spec = dict(spec)
    method = spec.pop("method")
    model = model_class.from_pretrained(path, **kwargs)
    convert(model, method, **spec)
    tensors = {}
    for f in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        if os.path.basename(f) != FITS:
            tensors.update({k: v for k, v in load_file(f).items() if ".favor_core." in k})
    incompatible = model.load_state_dict(tensors, strict=False)
    if incompatible.unexpected_keys:
        raise _core.Error(f"path: favor tensors {incompatible.unexpected_keys[:3]} do not fit "
                          f"this {type(model).__name__}")
    fits = os.path.join(path, FITS)
    if os.path.exists(fits):
        saved = load_file(fits)
        for layer, _, core in cores(model):
            if f"{layer}.a" in saved:
                core.fit = _core.KernelFit(saved[f"{layer}.a"].numpy(),
                                           saved[f"{layer}.basis"].numpy())
    model.eval()
    return model

