"""favor.hf.transfer: attention transfer (stage 1 of Hedgehog / LoLCATs). Every converted
layer's map is fitted to that layer's own softmax attention on calibration text, layer by
layer; finetune (stage 2) then trains the whole model or low-rank adapters briefly.

    report = favor.hf.transfer(model, batches, steps=200, checkpoint="runs/transfer")
    favor.hf.finetune(model, batches, steps=100, lora=dict(r=8))

What a layer learns depends on its method: FAVOR++ / FAVOR# their fit (favor.fit_kernel on
the layer's queries and keys, one per head); hedgehog, positive-fit and dijiang their map
tensors (W, b, lambda), and a learned decay its gamma, by Adam on the relative squared error
of the layer's favor output against its softmax output (the queries, keys and values all
come from the original model, so the layers are independent); vq its codebooks (k-means on
the layer's keys). FAVOR+ has nothing to learn. Deterministic (convert's seed draws the
starting maps; transfer adds no randomness); with `checkpoint`,
each finished layer is saved and a rerun resumes after the last one.
"""
import json
import math
import os

import torch

from .. import _core
from ..api import fit_kernel
from ..fit import floor_lambda
from .capture import capturing, exact
from .convert import cores
from .methods import FavorConfig

class TransferReport(list):
    """Per layer: what was fitted and the relative error of its favor output against its
    softmax output on the calibration text, before and after (a gated hybrid's: with the
    gate open, g = 1, the estimator it fitted; the layer is left with its gate closed)."""

    def __str__(self):
        return "\n".join(f"  layer {r['layer']}: {r['fitted']}, error {r['error_before']:.4f} -> "
                         f"{r['error_after']:.4f}" + (" (resumed)" if r.get("resumed") else "")
                         for r in self)


def transfer(model, batches, *, steps=200, lr=1e-2, checkpoint=None, progress=True,
             window_dropout=0.5):
    """Attention transfer of a model converted by favor.hf.convert (module docstring).
    batches: a list of dicts of model inputs (input_ids, attention_mask) or of input_ids
    tensors: the calibration text. steps, lr: Adam per learned layer. window_dropout
    (hybrid conversions, window > 0): the probability that a step fits with the window
    shortened to a random length in [0, window) (SWAX, arXiv 2509.24552), so that the
    estimator learns to carry what the window usually holds; 0 fits with the full window
    only. The draws are seeded (a rerun fits the same). Returns a TransferReport. The model
    is left in eval mode."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise _core.Error(f"steps: {steps!r} must be an integer >= 0")
    if isinstance(window_dropout, bool) or not isinstance(window_dropout, (int, float)) \
            or not 0.0 <= window_dropout <= 1.0:
        raise _core.Error(f"window_dropout: {window_dropout!r} must be a number in [0, 1]")
    if not batches:
        raise _core.Error("batches: give at least one calibration batch")
    layers = cores(model)
    if not layers:
        raise _core.Error("model: every layer is on softmax (softmax_layers); transfer fits "
                          "favor's layers and there are none")
    record = FavorConfig.of(model).record
    model.eval()
    with capturing() as records, torch.no_grad():
        for batch in batches:
            model(**_inputs(batch))
    settings = {"method": record.name, "steps": steps, "lr": lr,
                "batches": len(batches), "tokens": int(sum(_count(b) for b in batches))}
    if getattr(layers[0][2], "window", 0):
        settings["window_dropout"] = window_dropout
    _check_checkpoint(checkpoint, settings)
    report = TransferReport()
    bar = _bar(len(layers), progress)
    for layer, _, core in layers:
        data = records.get(layer, [])
        if not data:
            raise _core.Error(f"batches: layer {layer} was not reached by the calibration run")
        row = {"layer": layer}
        gated = getattr(core, "gate_log", None) is not None
        core.gate_open = gated  # a gated hybrid's estimator is fitted (and measured) at g = 1
        try:
            row["error_before"] = _error(record, core, data)
            path = None if checkpoint is None else os.path.join(checkpoint, f"layer{layer}.pt")
            if path is not None and os.path.exists(path):
                _load_layer(core, torch.load(path, weights_only=False))
                row["fitted"], row["resumed"] = "resumed from checkpoint", True
            else:
                row["fitted"] = _FITTERS[record.fits](core, data, steps, lr, window_dropout)
                if path is not None:
                    tmp = path + ".tmp"
                    torch.save(_layer_state(core), tmp)
                    os.replace(tmp, path)
            row["error_after"] = _error(record, core, data)
        finally:
            core.gate_open = False
        report.append(row)
        if bar is not None:
            bar.set_postfix(layer=layer, error=f"{row['error_after']:.3g}")
            bar.update(1)
    if bar is not None:
        bar.close()
    model.eval()
    return report


def _fit_codebook(core, data, steps, lr, window_dropout):
    core.initialise_codebook(_rows(data, 1))
    return "codebooks by k-means on the layer's keys"


def _fit_nothing(core, data, steps, lr, window_dropout):
    return f"nothing ({core.method})"


def _fit_kernel(core, data, steps, lr, window_dropout):
    q, k = _rows(data, 0), _rows(data, 1)
    core.fit = fit_kernel(core.kernel, q.numpy(), k.numpy(), scale=core.scale)
    return f"{core.kernel} fit per head"


def _fit_maps(core, data, steps, lr, window_dropout=0.0):
    params = [p for n, p in core.named_parameters() if p.requires_grad and n != "gate_log"]
    if not params or steps == 0:
        return "nothing to learn"
    targets = [exact(core, q, k, v, keep, causal) for q, k, v, keep, causal in data]
    opt = torch.optim.Adam(params, lr=lr)
    window = getattr(core, "window", 0)
    draws = torch.Generator().manual_seed(0)  # window dropout's draws: a rerun fits the same
    shortened = 0
    core.train()
    for step in range(steps):
        for group in opt.param_groups:  # cosine from lr to lr / 10
            group["lr"] = lr * (0.1 + 0.45 * (1.0 + math.cos(math.pi * step / steps)))
        q, k, v, keep, causal = data[step % len(data)]
        if window and float(torch.rand(1, generator=draws)) < window_dropout:
            core.window = int(torch.randint(0, window, (1,), generator=draws))
            shortened += 1
        try:
            loss = _relative_error(core.attend(q, k, v, None if keep is None else ~keep,
                                               causal), targets[step % len(data)], keep)
        finally:
            core.window = window
        opt.zero_grad()
        loss.backward()
        opt.step()
        if core.map_lambda is not None:  # feature weights stay nonzero, as fit_features
            floor_lambda(core.map_lambda, 1e-3)
    core.eval()
    names = [n for n, p in core.named_parameters() if p.requires_grad and n != "gate_log"]
    dropped = f" ({shortened} with the window shortened)" if window else ""
    return f"{', '.join(names)} by {steps} Adam steps{dropped}"


# Method.fits -> what transfer does to a layer of the method (methods.FITS)
_FITTERS = {"nothing": _fit_nothing, "kernel": _fit_kernel, "maps": _fit_maps,
            "codebook": _fit_codebook}


@torch.no_grad()
def _error(record, core, data):
    """Relative squared error of the layer's favor output against its softmax output."""
    if record.name == "exact":
        return 0.0
    if record.needs_fit and core.fit is None and any(r[4] for r in data):
        return float("nan")  # a causal FAVOR++/# layer runs only once fitted
    num = den = 0.0
    for q, k, v, keep, causal in data:
        ref = exact(core, q, k, v, keep, causal)
        pad = None if keep is None else ~keep
        # the codebook's k-means (prepare) before a first call: the whole forward
        got = core(q, k, v, pad, causal) if record.fits == "codebook" else \
            core.attend(q, k, v, pad, causal)
        w = _query_weight(keep, ref)
        num += float(((got - ref) ** 2 * w).sum())
        den += float((ref ** 2 * w).sum())
    return num / max(den, 1e-30)


def _relative_error(got, ref, keep):
    w = _query_weight(keep, ref)
    return ((got - ref) ** 2 * w).sum() / (ref ** 2 * w).sum().clamp_min(1e-30)


def _query_weight(keep, ref):
    """1 for the rows of real tokens, 0 for padding: [B, 1, N, 1]."""
    if keep is None:
        return torch.ones(1, 1, 1, 1, dtype=ref.dtype)
    return keep[:, None, :, None].to(ref.dtype)


def _rows(data, which):
    """The real tokens' rows of q (0) or k (1) of every batch, per head: [1, H, T, D]."""
    parts = []
    for record in data:
        x, keep = record[which], record[3]
        x = x.permute(1, 0, 2, 3)  # [H, B, N, D]
        if keep is not None:
            x = x[:, keep]
        else:
            x = x.reshape(x.shape[0], -1, x.shape[-1])
        parts.append(x)
    return torch.cat(parts, dim=1)[None].contiguous()


def _layer_state(core):
    return {"state": core.state_dict()}  # a FavorCore's fit is in it (fit_a, fit_basis)


def _load_layer(core, saved):
    core.load_state_dict(saved["state"])
    if saved.get("fit") is not None:  # a checkpoint of an earlier favor.hf kept it apart
        core.fit = _core.KernelFit(*saved["fit"])


def _check_checkpoint(checkpoint, settings, record="transfer.json", what="a transfer"):
    """Creates the checkpoint folder with its settings file `record`, or checks that the one
    there holds the same settings (favor.Error otherwise: another run's folder). Shared by
    transfer and distill."""
    if checkpoint is None:
        return
    os.makedirs(checkpoint, exist_ok=True)
    path = os.path.join(checkpoint, record)
    settings = json.loads(json.dumps(settings))  # as JSON reads it back (tuples: lists)
    if os.path.exists(path):
        with open(path) as f:
            before = json.load(f)
        if before != settings:
            raise _core.Error(f"checkpoint: {checkpoint} holds {what} with {before}; this "
                              f"one is {settings} (use another folder)")
    else:
        with open(path, "w") as f:
            json.dump(settings, f)


def _inputs(batch):
    if isinstance(batch, torch.Tensor):
        return {"input_ids": batch}
    if isinstance(batch, dict):
        return dict(batch)
    raise _core.Error(f"batches: an entry is a {type(batch).__name__}; give input_ids tensors "
                      "or dicts of model inputs")


def _count(batch):
    inputs = _inputs(batch)
    mask = inputs.get("attention_mask")
    return int(mask.sum()) if mask is not None else inputs["input_ids"].numel()


def _bar(total, progress, desc="favor.hf.transfer", unit="layer"):
    if not progress:
        return None
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=desc, unit=unit)
