"""Converting a trained CharTransformer to each favor method, with whatever the method must
first learn from calibration text: the methods of the conversion study
(examples/shakespeare/study.py, docs/model.md).

    qkv = layer_qkv(model, ids)                 # per layer (q, k, v) [B, H, N, head_dim]
    fav = convert_method(model, "favorsharp-256", calibration, heldout)

Method names (F = the features a query or key maps to, i.e. the state size per head is
F x (head_dim + 1)):
- favor-iid-M, favor-orth-M: FAVOR+ (positive features, M iid or orthogonal rows; F = M);
- favorpp-M, favorsharp-M: FAVOR++ / FAVOR# with one fit per layer and head from the
  calibration queries and keys (favor.fit_kernel; held fixed afterwards); F = M;
- hedgehog-M: the learned hedgehog map (W, b per head; F = 2 M), positive-fit-M: positive
  features with learned W, b, lambda (F = M), wpff-M: DiJiang's weighted positive features
  on the DCT projection, only lambda learned (F = M). Each is fitted per layer by
  distillation against the layer's exact attention on the calibration text
  (favor.fit_features, output objective, causal), then trains on with the model;
- vq-C: Transformer-VQ with C codes, codebooks by k-means on the calibration keys;
- anything favor.models.presets.attention_preset names (no calibration needed).
"""
import re

import numpy as np
import torch

from .. import _core
from ..fit import fit_features
from ..api import fit_kernel
from .char_transformer import convert_attention
from .presets import attention_preset

FIT_STEPS = 300
FIT_LR = 1e-2

# learned maps: name -> (kernel, projection, parameters learned by the fit, module keywords)
_LEARNED = {
    "hedgehog": ("hedgehog", "orthogonal", ("weights", "bias"), dict(learn_features=True)),
    "positive-fit": ("positive", "orthogonal", ("weights", "bias", "lambda"),
                     dict(learn_features=True, feature_weights=True)),
    "wpff": ("positive", "dct", ("lambda",), dict(feature_weights=True)),
}


def calibration_windows(data, context, seed=0, count=16):
    """The calibration text of a conversion: `count` random training windows [count,
    context] from a generator seeded seed + 2 (the scripts' and the study's choice)."""
    return data.batch("train", count, context, torch.Generator().manual_seed(seed + 2))[0]


@torch.no_grad()
def layer_qkv(model, ids):
    """The queries, keys and values every attention layer of `model` computes on ids
    [B, N]: a list (one per layer) of (q, k, v) float32 tensors [B, H, N, head_dim], the
    inputs of the layer's attention core (after the q/k/v projections, before the scale)."""
    captured = []
    hooks = [b.norm1.register_forward_hook(lambda m, i, o: captured.append(o))
             for b in model.blocks]
    was = model.training
    model.eval()
    try:
        model(torch.as_tensor(ids, dtype=torch.long))
    finally:
        for h in hooks:
            h.remove()
        model.train(was)
    out = []
    for block, x in zip(model.blocks, captured):
        a = block.attn
        out.append(tuple(a._heads(p(x)).float().contiguous()
                         for p in (a.q_proj, a.k_proj, a.v_proj)))
    return out


def _per_head(x):
    """[B, H, N, D] -> [1, H, B N, D] numpy float32: every window of a head as one sequence,
    so a fit has one entry per head."""
    b, h, n, d = x.shape
    return np.ascontiguousarray(x.permute(1, 0, 2, 3).reshape(1, h, b * n, d).numpy())


def parse_method(name):
    """(family, size) of a study method name; raises favor.Error for an unknown one."""
    m = re.fullmatch(r"(favorpp|favorsharp|hedgehog|positive-fit|wpff)-(\d+)", name)
    if m:
        return m.group(1), int(m.group(2))
    attention_preset(name)  # raises for an unknown name
    return None, None


def convert_method(model, name, calibration=None, heldout=None, seed=0, verbose=False,
                   fit_steps=FIT_STEPS, fit_lr=FIT_LR):
    """A copy of `model` converted to method `name` (the module docstring), its fits made on
    `calibration` ids [B, N] (training text; required by FAVOR++/#, the learned maps and
    VQ) and, for the learned maps, checked on `heldout` ids (default: the last quarter of
    the calibration windows). Returns (model, info) where info records the fits (for the
    learned maps, each layer's held-out error before and after)."""
    family, size = parse_method(name)
    if family is None:
        spec = attention_preset(name)
        if spec["method"] == "vq" and calibration is None:
            raise _core.Error(f"calibration: {name} builds its codebooks by k-means on "
                              "calibration text; give training windows")
        return convert_attention(model, calibration=calibration, **spec), {}
    if calibration is None:
        raise _core.Error(f"calibration: {name} is fitted to calibration text; give "
                          "training windows")
    info = {"layers": []}
    if family in ("favorpp", "favorsharp"):
        qkv = layer_qkv(model, calibration)
        spec = {"method": "favor", "kernel": family, "features": size,
                "projection": "orthogonal", "seed": seed}
        fits = [fit_kernel(family, _per_head(q), _per_head(k)) for q, k, _ in qkv]
        for f in fits:
            info["layers"].append({"a_mean": float(np.mean(f.a)), "a_min": float(np.min(f.a))})
        return convert_attention(model, layer_kwargs=[{"fit": f} for f in fits], **spec), info
    kernel, projection, learn, module = _LEARNED[family]
    if heldout is None:
        cut = max(1, calibration.shape[0] * 3 // 4)
        calibration, heldout = calibration[:cut], calibration[cut:]
    maps = []
    train, held = layer_qkv(model, calibration), layer_qkv(model, heldout)
    for i, ((q, k, v), (hq, hk, hv)) in enumerate(zip(train, held)):
        fm, hist = fit_features(q, k, v, kernel=kernel, features=size, steps=fit_steps,
                                lr=fit_lr, heldout=(hq, hk, hv), causal=True, learn=learn,
                                seed=seed + 1000 * i, projection=projection,
                                eval_every=fit_steps, verbose=verbose)
        maps.append(fm)
        info["layers"].append({"heldout_error_start": hist[0]["heldout_error"],
                               "heldout_error_end": hist[-1]["heldout_error"],
                               "seconds": hist[-1]["seconds"]})
    spec = dict({"method": "favor", "kernel": kernel, "features": size,
                 "projection": projection, "seed": seed}, **module)
    return convert_attention(model, layer_kwargs=[{"feature_init": fm} for fm in maps],
                             **spec), info
