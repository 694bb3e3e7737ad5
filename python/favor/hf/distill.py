"""favor.hf.distill: end-to-end distillation (stage 2 of RADLADS, LoLCATs and fla's
hybrid-distillation recipes). After attention transfer (stage 1, favor.hf.transfer) fits each
layer on its own, the converted model learns to match the original's next-token
distributions: the KL divergence KL(teacher || student) of softmax(logits / T), times T^2.

    favor.hf.convert(student, "hedgehog", features=64, window=64, sinks=4)
    favor.hf.transfer(student, batches, steps=200)
    report = favor.hf.distill(student, teacher, batches, steps=300, train="lora",
                              checkpoint="runs/distill")
    favor.hf.save_pretrained(student, "adapter")      # compact: favor tensors + LoRA deltas

Memory: the logits are never whole. Each model's last hidden state is computed once
(model.base_model); the KL is summed over chunks of `chunk` positions, each chunk's logits
made from the hidden states inside a checkpointed function, so the backward holds one
chunk's [chunk, vocab] at a time (49152-token vocabularies at 1024 tokens: 200 MB a copy
otherwise).
"""
import math
import os
import time

import torch
from torch.utils.checkpoint import checkpoint as _checkpointed

from .. import _core
from . import adapters
from .convert import cores
from .transfer import _bar, _check_checkpoint, _count, _inputs

TRAIN = {"attention": "favor's maps and each attention module's own weights (q, k, v, o)",
         "lora": "favor's maps and LoRA adapters on the attention projections (peft)",
         "all": "every weight of the model"}


class DistillReport(list):
    """The loss of every step (KL in nats per token, times T^2), with tokens (real tokens
    seen), seconds (the wall time of the steps run by this call), steps and resumed_at (the
    step a checkpoint resumed from, or None)."""

    def __str__(self):
        last = f", last loss {self[-1]:.4f}" if self else ""
        return (f"favor.hf.distill: {self.steps} steps, {self.tokens} tokens, "
                f"{self.seconds / 60:.1f} min{last}")


def distill(student, teacher, batches, *, steps, lr=1e-4, temperature=1.0, train="lora",
            lora=None, window_dropout=None, chunk=256, seed=0, clip=1.0, checkpoint=None,
            save_every=25, progress=True):
    """Trains `student` (converted by favor.hf.convert) to match `teacher` (the original
    model, the same tokenizer) for `steps` AdamW steps over batches (cycled in order; dicts
    of model inputs or input_ids tensors). The loss is the mean over real tokens (the
    attention_mask) of KL(softmax(t / T) || softmax(s / T)) T^2, t and s the teacher's and
    the student's logits. train: one of TRAIN ("lora": add_adapters(student, **lora) first;
    the adapters stay unmerged, so favor.hf.save_pretrained writes the compact form).
    window_dropout (hybrids: default 0.5, else 0): the probability that a step runs every
    layer with the window shortened to one random length in [0, window) ([1, window) for
    method 'window' without sinks). Deterministic: the
    draws depend on (seed, step) only. checkpoint: a folder where the trained tensors, the
    optimiser and the losses are saved every save_every steps and at the end; a rerun with
    the same settings resumes there. Returns a DistillReport. The student is left in eval
    mode."""
    _check(steps, temperature, train, window_dropout, chunk, batches)
    layers = cores(student)
    window = getattr(layers[0][2], "window", 0) or 0
    # the shortest window a step may take: 1 where the sinks alone would be no attention
    # (method 'window' without sinks), else 0 (the estimator, or the sinks, remain)
    shortest = int(any(core.method == "window" and not core.sinks for _, _, core in layers))
    if window_dropout is None:
        window_dropout = 0.5 if window else 0.0
    head, t_head = student.get_output_embeddings(), teacher.get_output_embeddings()
    if head is None or t_head is None or head.weight.shape != t_head.weight.shape:
        raise _core.Error("teacher: student and teacher need language-model heads of one "
                          "vocabulary (the same tokenizer)")
    if train == "lora":
        lora = adapters.add_adapters(student, **(lora or {}))
    elif lora is not None:
        raise _core.Error(f"lora: options for train='lora'; train is {train!r}")
    params = trainable(student, train, layers)
    settings = {"steps": steps, "lr": lr, "temperature": temperature, "train": train,
                "lora": lora, "window_dropout": window_dropout, "seed": seed, "clip": clip,
                "batches": len(batches), "tokens": int(sum(_count(b) for b in batches))}
    opt = torch.optim.AdamW([p for _, p in params], lr=lr, weight_decay=0.0)
    report = DistillReport()
    report.resumed_at = _resume(checkpoint, settings, params, opt, report)
    start = report.resumed_at or 0
    report.steps, report.tokens, report.seconds = steps, 0, 0.0
    teacher.eval()
    student.train()
    bar = _bar(steps, progress, "favor.hf.distill", "step")
    if bar is not None:
        bar.update(start)
    began = time.perf_counter()
    for step in range(start, steps):
        for group in opt.param_groups:  # cosine from lr to lr / 10
            group["lr"] = lr * (0.1 + 0.45 * (1.0 + math.cos(math.pi * step / steps)))
        inputs = _inputs(batches[step % len(batches)])
        draws = torch.Generator().manual_seed(seed * 1_000_003 + step)
        short = window
        if window > shortest and float(torch.rand(1, generator=draws)) < window_dropout:
            short = int(torch.randint(shortest, window, (1,), generator=draws))
        try:
            for _, _, core in layers:
                core.window = short
            loss = kl_loss(student, teacher, inputs, temperature, chunk)
            opt.zero_grad()
            loss.backward()
        finally:
            for _, _, core in layers:
                core.window = window
        if clip:
            torch.nn.utils.clip_grad_norm_([p for _, p in params], clip)
        opt.step()
        report.append(float(loss.detach()))
        report.tokens += _count(inputs)
        if bar is not None:
            bar.set_postfix(kl=f"{report[-1]:.4g}")
            bar.update(1)
        if checkpoint is not None and ((step + 1) % save_every == 0 or step + 1 == steps):
            _save(checkpoint, step + 1, params, opt, report)
    report.seconds = time.perf_counter() - began
    if bar is not None:
        bar.close()
    student.eval()
    return report


def kl_loss(student, teacher, inputs, temperature=1.0, chunk=256):
    """The mean over real tokens of KL(softmax(t / T) || softmax(s / T)) T^2 (distill's loss),
    the logits made and dropped chunk by chunk (module docstring)."""
    with torch.no_grad():  # no cache: nothing is generated
        t_hidden = teacher.base_model(**inputs, use_cache=False).last_hidden_state
    hidden = student.base_model(**inputs, use_cache=False).last_hidden_state
    keep = inputs.get("attention_mask")
    weight = (torch.ones(hidden.shape[:2]) if keep is None else keep).to(hidden.dtype)
    head, t_head = student.get_output_embeddings(), teacher.get_output_embeddings()
    total = hidden.new_zeros(())
    for a in range(0, hidden.shape[1], chunk):
        h, w = hidden[:, a:a + chunk], weight[:, a:a + chunk]
        with torch.no_grad():
            t_logp = torch.log_softmax(t_head(t_hidden[:, a:a + chunk]) / temperature, -1)
        total = total + _checkpointed(_chunk_kl, h, t_logp, w, head, temperature,
                                      use_reentrant=False)
    return total * temperature ** 2 / weight.sum().clamp_min(1.0)


def _chunk_kl(h, t_logp, w, head, temperature):
    logp = torch.log_softmax(head(h) / temperature, -1)
    return ((t_logp.exp() * (t_logp - logp)).sum(-1) * w).sum()


def trainable(model, train, layers=None):
    """[(name, parameter)] that `train` (a key of TRAIN) trains; every other parameter of
    the model is frozen (requires_grad False)."""
    layers = cores(model) if layers is None else layers
    core_ids = {id(p) for _, _, core in layers for p in core.parameters()}
    attention = {id(p) for _, module, _ in layers for p in module.parameters()}
    chosen = []
    for name, p in model.named_parameters():
        if train == "all":
            on = True
        elif train == "lora":
            on = "lora_" in name or id(p) in core_ids
        else:
            on = id(p) in attention
        p.requires_grad_(on)
        if on:
            chosen.append((name, p))
    if not chosen:
        raise _core.Error(f"train: {train!r} leaves nothing to train in this model")
    return chosen


def _check(steps, temperature, train, window_dropout, chunk, batches):
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise _core.Error(f"steps: {steps!r} must be an integer >= 0")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
            or not temperature > 0 or math.isinf(temperature):
        raise _core.Error(f"temperature: {temperature!r} must be a finite number > 0")
    if train not in TRAIN:
        raise _core.Error(f"train: {train!r} is not one of {', '.join(TRAIN)}")
    if window_dropout is not None and (isinstance(window_dropout, bool) or not isinstance(
            window_dropout, (int, float)) or not 0.0 <= window_dropout <= 1.0):
        raise _core.Error(f"window_dropout: {window_dropout!r} must be a number in [0, 1]")
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise _core.Error(f"chunk: {chunk!r} must be an integer >= 1")
    if not batches:
        raise _core.Error("batches: give at least one batch")


_STATE = "distill.pt"


def _resume(folder, settings, params, opt, report):
    """Loads the checkpoint in `folder` (same settings, else favor.Error); the step it
    holds, or None."""
    if folder is None:
        return None
    _check_checkpoint(folder, settings, "distill.json", "a distillation")
    state = os.path.join(folder, _STATE)
    if not os.path.exists(state):
        return None
    saved = torch.load(state, weights_only=False)
    with torch.no_grad():
        for name, p in params:
            p.copy_(saved["params"][name])
    opt.load_state_dict(saved["opt"])
    report.extend(saved["losses"])
    return saved["step"]


def _save(folder, step, params, opt, report):
    state = {"step": step, "params": {n: p.detach().clone() for n, p in params},
             "opt": opt.state_dict(), "losses": list(report)}
    tmp = os.path.join(folder, _STATE + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, os.path.join(folder, _STATE))
