"""Which layers of a converted model to keep on softmax (convert's softmax_layers), chosen by
measurement.

    with fh.softmax_at(student, [7, 18]):      # these layers on softmax inside the block
        ...
    report = fh.rank_layers(student, teacher, batches, recall=lr.copy_batches(ids),
                            greedy=4)
    print(report)                              # every layer with its figures; the search

rank_layers restores one layer at a time to the model's own softmax attention and measures
the KL to the teacher on `batches` (and, given `recall` sequences, the loss on their second
readings: copying from far back); every favor layer gets its row. Copying is a circuit
across layers, so one layer alone may show little: `greedy=k` then adds, k times, the
layer that helps most given those already chosen. Cost: one forward of the student per
batch and recall sequence for each layer tried: L layers for the ranking, then (L - 1) + (L - 2)
+ ... (k - 1 terms) for the search, whose first round is the ranking (the teacher's
distributions are computed once).
"""
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from .. import _core
from .convert import cores, softmax_attention
from .methods import FavorConfig


@contextmanager
def softmax_at(model, layers):
    """Inside the block, `layers` (favor layers of a converted model) run the model's own
    softmax attention besides the plan's softmax layers; everything is put back after."""
    layers = list(layers)
    spec = FavorConfig.of(model)
    found = {layer: module for layer, module, _ in cores(model)}
    missing = [i for i in layers if i not in found]
    if missing:
        raise _core.Error(f"layers: {missing[0]} is not a favor layer of the model (favor "
                          f"layers: {sorted(found)})")
    impl = softmax_attention(model, spec)
    config = model.config
    saved = config.favor
    try:
        config.favor = {**saved, "softmax_layers": sorted(set(spec.softmax_layers) |
                                                          set(layers)),
                        "softmax_attention": impl}
        for i in layers:
            found[i].favor_softmax = impl
        yield model
    finally:
        for i in layers:
            found[i].favor_softmax = None
        config.favor = saved


@dataclass
class RankReport:
    """baseline: the model's figures as its plan stands ({"kl", "recall"}); rows: one per
    favor layer restored alone ({"layer", "kl", "recall", "kl_cut", "recall_cut"}), best
    first by `by`; greedy: the search, one row per layer added ({"layers", "kl", "recall"})."""
    baseline: dict
    rows: list
    greedy: list = field(default_factory=list)
    by: str = "kl"

    def best(self, k):
        """The k best single layers."""
        return [r["layer"] for r in self.rows[:k]]

    def __str__(self):
        def fig(r):
            rec = "" if r.get("recall") is None else f", recall loss {r['recall']:.4f}"
            return f"KL {r['kl']:.4f}{rec}"
        lines = [f"favor.hf.rank_layers (by {self.by}): as converted {fig(self.baseline)}"]
        lines += [f"  layer {r['layer']}: {fig(r)}" for r in self.rows]
        if self.greedy:
            lines.append("  greedy search:")
            lines += [f"    {r['layers']}: {fig(r)}" for r in self.greedy]
        return "\n".join(lines)


def rank_layers(student, teacher, batches, *, recall=None, greedy=0, by=None, progress=True):
    """Ranks the favor layers of `student` (converted) by how much restoring each alone to
    softmax cuts the KL to `teacher` (the original) on `batches` (dicts of model inputs or
    input_ids tensors) and, with `recall` (favor.hf.longrange.copy_batches: [(ids, start)]),
    the mean loss on each sequence's tokens after `start` (the second reading, as
    copy_recall scores it). greedy=k: also the greedy search
    of k layers. by: 'kl' or 'recall' (default: 'recall' when given, else 'kl'), the figure
    the ranking and the search minimise. Returns a RankReport; the model is unchanged."""
    if not batches:
        raise _core.Error("batches: give at least one batch")
    by = by or ("recall" if recall else "kl")
    if by not in ("kl", "recall") or (by == "recall" and not recall):
        raise _core.Error(f"by: {by!r} must be 'kl' or, with recall sequences, 'recall'")
    layers = [layer for layer, _, _ in cores(student)]
    if isinstance(greedy, bool) or not isinstance(greedy, int) or not 0 <= greedy <= len(layers):
        raise _core.Error(f"greedy: {greedy!r} must be an integer in [0, {len(layers)}] (the "
                          "favor layers)")
    inputs = [_inputs(b) for b in batches]
    device = next(student.parameters()).device
    with torch.no_grad():
        targets = [teacher(**_on(x, device), use_cache=False).logits.float().log_softmax(-1)
                   for x in inputs]
    was_training = student.training
    student.eval()

    def measure():
        with torch.no_grad():
            kl = n = 0.0
            for x, logp in zip(inputs, targets):
                logq = student(**_on(x, device), use_cache=False).logits.float().log_softmax(-1)
                per = (logp.exp() * (logp - logq)).sum(-1)
                keep = x.get("attention_mask")
                keep = torch.ones_like(per) if keep is None else keep.to(per)
                kl += float((per * keep).sum())
                n += float(keep.sum())
            row = {"kl": kl / n, "recall": None}
            if recall:
                losses = []
                for ids, start in recall:
                    logits = student(input_ids=ids[None].to(device),
                                     use_cache=False).logits[0].float()
                    nll = torch.nn.functional.cross_entropy(logits[:-1], ids[1:].to(device),
                                                            reduction="none")
                    losses.append(float(nll[start:].mean()))
                row["recall"] = sum(losses) / len(losses)
        return row

    total = len(layers) + sum(len(layers) - i for i in range(1, greedy))  # (round 1 = rows)
    bar = _bar(total + 1, progress)
    baseline = measure()
    bar.update(1)
    rows = []
    for layer in layers:
        with softmax_at(student, [layer]):
            row = {"layer": layer, **measure()}
        row["kl_cut"] = baseline["kl"] - row["kl"]
        row["recall_cut"] = baseline["recall"] - row["recall"] if recall else None
        rows.append(row)
        bar.update(1)
    rows.sort(key=lambda r: r[by])
    path, chosen = [], []
    for step in range(greedy):
        if step == 0:  # the first round is the ranking itself
            tried = [({"kl": r["kl"], "recall": r["recall"]}, r["layer"]) for r in rows]
            best, layer = min(tried, key=lambda t: t[0][by])
            chosen.append(layer)
            path.append({"layers": list(chosen), **best})
            continue
        tried = []
        for layer in layers:
            if layer in chosen:
                continue
            with softmax_at(student, chosen + [layer]):
                tried.append((measure(), layer))
            bar.update(1)
        best, layer = min(tried, key=lambda t: t[0][by])
        chosen.append(layer)
        path.append({"layers": list(chosen), **best})
    bar.close()
    student.train(was_training)
    return RankReport(baseline, rows, path, by)


def gates(model):
    """{layer: [g per head]} of a gated hybrid (convert's gate=True): how much of each head's
    attention beyond the window the estimator is given (0: the window and sinks alone)."""
    found = {layer: [float(g) for g in core.gate.detach().cpu()]
             for layer, _, core in cores(model) if getattr(core, "gate_log", None) is not None}
    if not found:
        raise _core.Error("model: has no gates; convert a hybrid with gate=True")
    return found


def _inputs(batch):
    return batch if isinstance(batch, dict) else {"input_ids": batch}


def _on(inputs, device):
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def _bar(total, progress):
    from tqdm.auto import tqdm
    return tqdm(total=total, desc="favor.hf.rank_layers", unit="pass", disable=not progress)
