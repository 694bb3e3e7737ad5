"""favor.hf.distill: end-to-end distillation (stage 2 of RADLADS, LoLCATs and fla's
hybrid-distillation recipes). After attention transfer (stage 1, favor.hf.transfer) fits each
layer on its own, the converted model learns to match the original's next-token
distributions: the KL divergence KL(teacher || student) of softmax(logits / T), times T^2.

    favor.hf.convert(student, "hedgehog", features=64, window=64, sinks=4)
    favor.hf.transfer(student, batches, steps=200)
    report = favor.hf.distill(student, teacher, batches, steps=300, train="lora",
                              checkpoint="runs/distill")
    favor.hf.save_pretrained(student, "adapter")      # compact: favor tensors + LoRA deltas

The teacher is the original model (its whole distribution, exact KL) or a
favor.hf.TeacherCache (its top k tokens computed once and kept on disk: every study row and
resumed run reads them; the KL over k + 1 outcomes, favor.hf.kl).

The step (docs/hf.md, "Distillation at scale"): precision 'auto' runs it in bf16 where the
machine has it (favor.hf.precision: frozen weights in bfloat16, autocast, float32 masters
of what trains), else float32, and says which; the head and the KL are fused
(favor.hf.kl.linear_kl: the logits made and dropped chunk by chunk, each chunk's gradient
made in the forward, so the backward holds no [positions, vocab] block); no cache is built
(use_cache=False); max_seconds stops a run on time, checkpointed, to be resumed.
"""
import contextlib
import math
import os
import time

import torch

from .. import _core
from . import adapters
from .convert import cores
from .kl import Full, linear_kl, product_dtype
from .precision import low_precision, resolve
from .teacher_cache import TeacherCache
from .transfer import _bar, _check_checkpoint, _count, _inputs

TRAIN = {"attention": "favor's maps and each attention module's own weights (q, k, v, o)",
         "lora": "favor's maps and LoRA adapters on the attention projections (peft)",
         "all": "every weight of the model"}


class DistillReport(list):
    """The loss of every step (KL in nats per token, times T^2), with tokens (real tokens
    seen by this call), seconds (the wall time of the steps run by this call), steps (the
    steps asked for), done (the steps finished, < steps when max_seconds stopped the run),
    resumed_at (the step a checkpoint resumed from, or None), precision ('bf16' or
    'float32': what ran) and teacher ('model' or 'cache k=K')."""

    def __str__(self):
        last = f", last loss {self[-1]:.4f}" if self else ""
        rate = f", {self.tokens / self.seconds:.0f} tokens/s" if self.seconds else ""
        return (f"favor.hf.distill: {self.done}/{self.steps} steps, {self.tokens} tokens, "
                f"{self.seconds / 60:.1f} min{rate}, {self.precision}, teacher "
                f"{self.teacher}{last}")


def distill(student, teacher, batches, *, steps, lr=1e-4, temperature=1.0, train="lora",
            lora=None, window_dropout=None, chunk=256, seed=0, clip=1.0, checkpoint=None,
            save_every=25, progress=True, precision="auto", max_seconds=None, compile=False,
            gate_lr=0.1):
    """Trains `student` (converted by favor.hf.convert) to match `teacher` (the original
    model, the same tokenizer, or a favor.hf.TeacherCache of it) for `steps` AdamW steps
    over batches (cycled in order; dicts of model inputs or input_ids tensors). The loss is
    the mean over real tokens (the attention_mask) of KL(softmax(t / T) || softmax(s / T))
    T^2, t and s the teacher's and the student's logits (a cache: over its top k and the
    rest, favor.hf.kl). train: one of TRAIN ("lora": add_adapters(student, **lora) first;
    the adapters stay unmerged, so favor.hf.save_pretrained writes the compact form).
    window_dropout (hybrids: default 0.5, else 0): the probability that a step runs every
    layer with the window shortened to one random length in [0, window) ([1, window) for
    method 'window' without sinks). Deterministic: the draws depend on (seed, step) only.
    precision: 'auto' (bf16 where the device has it, favor.hf.precision), 'bf16' or
    'float32'. checkpoint: a folder where the trained tensors, the optimiser and the losses
    are saved every save_every steps and at the end; a rerun with the same settings resumes
    there. max_seconds: stop after the step that passes this wall time (checkpointed; a rerun
    resumes). gate_lr: the step of a gated hybrid's gates (their gate_log = log g: Adam moves
    it about gate_lr a step, so a gate closed at 1e-3 can open to 1 in tens of steps,
    where lr would take tens of thousands). compile: torch.compile each decoder layer of the
    student that runs favor (the plan's softmax layers stay eager) and the loss's
    elementwise part for this call (undone at the end): the first steps pay the compiling
    (about 25 s at SmolLM2's size, again for the first few window lengths window dropout
    draws), every later step runs faster (docs/hf.md, "Distillation at scale"). Returns a
    DistillReport. The student is left in eval mode."""
    _check(steps, temperature, train, window_dropout, chunk, batches, max_seconds)
    if not isinstance(compile, bool):
        raise _core.Error(f"compile: {compile!r} must be True or False")
    layers = cores(student)
    window = max((getattr(core, "window", 0) or 0 for _, _, core in layers), default=0)
    # the shortest window a step may take: 1 where the sinks alone would be no attention
    # (method 'window' without sinks), else 0 (the estimator, or the sinks, remain)
    shortest = int(any(core.method == "window" and not core.sinks for _, _, core in layers))
    if window_dropout is None:
        window_dropout = 0.5 if window else 0.0
    head = student.get_output_embeddings()
    source = _teacher_source(teacher, head, temperature)
    device = head.weight.device
    ran = resolve(precision, device)
    if train == "lora":
        lora = adapters.add_adapters(student, **(lora or {}))
    elif lora is not None:
        raise _core.Error(f"lora: options for train='lora'; train is {train!r}")
    params = trainable(student, train, layers)
    settings = {"steps": steps, "lr": lr, "temperature": temperature, "train": train,
                "lora": lora, "window_dropout": window_dropout, "seed": seed, "clip": clip,
                "batches": len(batches), "tokens": int(sum(_count(b) for b in batches)),
                "precision": ran, "teacher": _teacher_name(teacher)}
    gates = [p for n, p in params if n.endswith("gate_log")]
    if gates:
        if isinstance(gate_lr, bool) or not isinstance(gate_lr, (int, float)) or gate_lr <= 0:
            raise _core.Error(f"gate_lr: {gate_lr!r} must be a number > 0")
        settings["gate_lr"] = gate_lr
    rest = [p for n, p in params if not n.endswith("gate_log")]
    opt = torch.optim.AdamW([{"params": rest}] + ([{"params": gates, "lr": gate_lr}]
                                                  if gates else []), lr=lr, weight_decay=0.0)
    report = DistillReport()
    report.resumed_at = _resume(checkpoint, settings, params, opt, report)
    start = report.resumed_at or 0
    report.steps, report.done, report.tokens, report.seconds = steps, start, 0, 0.0
    report.precision, report.teacher = ran, settings["teacher"]
    live = teacher if not isinstance(teacher, TeacherCache) else None
    if live is not None:
        live.eval()
    # the teacher's weights cast to bfloat16 once for the run where its forward is bf16 (a
    # live teacher in a bf16 run; a bf16 cache's teacher, making missing entries on the way)
    side = live if ran == "bf16" else None
    if live is None and teacher.precision == "bf16":
        side = teacher.teacher
    student.train()
    bar = _bar(steps, progress, f"favor.hf.distill ({ran})", "step")
    if bar is not None:
        bar.update(start)
    began = time.perf_counter()
    with _compiled(student, layers, compile), low_precision(ran == "bf16", student), \
            low_precision(side is not None, *([side] if side is not None else []),
                          frozen_only=False):
        for step in range(start, steps):
            cosine = 0.1 + 0.45 * (1.0 + math.cos(math.pi * step / steps))  # to a tenth
            for group, base in zip(opt.param_groups, (lr, gate_lr)):
                group["lr"] = base * cosine
            inputs = _on(_inputs(batches[step % len(batches)]), device)
            draws = torch.Generator().manual_seed(seed * 1_000_003 + step)
            short = window
            if window > shortest and float(torch.rand(1, generator=draws)) < window_dropout:
                short = int(torch.randint(shortest, window, (1,), generator=draws))
            try:
                for _, _, core in layers:
                    core.window = short
                loss = _loss(student, source, inputs, temperature, chunk)
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
            report.done = step + 1
            if bar is not None:
                bar.set_postfix(kl=f"{report[-1]:.4g}")
                bar.update(1)
            late = max_seconds is not None and time.perf_counter() - began > max_seconds
            if checkpoint is not None and ((step + 1) % save_every == 0 or step + 1 == steps
                                           or late):
                _save(checkpoint, step + 1, params, opt, report)
            if late:
                break
    report.seconds = time.perf_counter() - began
    if bar is not None:
        bar.close()
    student.eval()
    return report


def kl_loss(student, teacher, inputs, temperature=1.0, chunk=256):
    """The mean over real tokens of KL(softmax(t / T) || softmax(s / T)) T^2 (distill's loss;
    teacher a model or a TeacherCache), the logits made and dropped chunk by chunk
    (favor.hf.kl.linear_kl)."""
    source = _teacher_source(teacher, student.get_output_embeddings(), temperature)
    return _loss(student, source, _inputs(inputs), temperature, chunk)


def _loss(student, source, inputs, temperature, chunk):
    target = source(inputs)  # the teacher first: its forward holds no graph
    hidden = student.base_model(**inputs, use_cache=False).last_hidden_state
    keep = inputs.get("attention_mask")
    weight = torch.ones(hidden.shape[:2], device=hidden.device) if keep is None else keep
    total = linear_kl(hidden, student.get_output_embeddings().weight, target, temperature,
                      weight, chunk)
    return total / weight.sum().clamp_min(1.0).to(total.dtype)


def _teacher_source(teacher, head, temperature):
    """inputs -> the teacher's target (kl.Full or kl.TopK) over the flattened positions."""
    if head is None:
        raise _core.Error("student: it has no language-model head")
    vocab = head.weight.shape[0]
    if isinstance(teacher, TeacherCache):
        if teacher.meta.get("vocab") != vocab:
            raise _core.Error(f"teacher: the cache holds a {teacher.meta.get('vocab')}-token "
                              f"vocabulary, the student's head {vocab} (the same tokenizer)")
        if teacher.temperature != float(temperature):
            raise _core.Error(f"temperature: {temperature!r}, but the cache was made at "
                              f"{teacher.temperature} (make one at this temperature)")
        return lambda inputs: _to(teacher.get(inputs), head.weight.device)
    t_head = teacher.get_output_embeddings() if hasattr(teacher, "get_output_embeddings") \
        else None
    if t_head is None or t_head.weight.shape != head.weight.shape:
        raise _core.Error("teacher: student and teacher need language-model heads of one "
                          "vocabulary (the same tokenizer)")

    def live(inputs):
        with torch.no_grad():  # no cache: nothing is generated
            t_hidden = teacher.base_model(**inputs, use_cache=False).last_hidden_state
        dtype = product_dtype(t_hidden)
        t_hidden = t_hidden.reshape(-1, t_hidden.shape[-1]).to(dtype)
        w = t_head.weight.detach().to(dtype)

        def rows(a, b):
            z = (t_hidden[a:b] @ w.t()).float() / temperature
            return torch.log_softmax(z, -1)
        return Full(rows)
    return live


@contextlib.contextmanager
def _compiled(student, layers, on):
    """With on: each decoder layer (the parent of a converted attention module) compiled,
    and the window an int the graphs take as an input (window dropout changes it every
    step); undone at exit."""
    if not on:
        yield
        return
    from . import kl
    names = {id(m): n for n, m in student.named_modules()}
    blocks = [student.get_submodule(names[id(module)].rpartition(".")[0])
              for _, module, _ in layers]
    if any(core.method == "window" for _, _, core in layers):
        # method 'window' attends through torch's band, whose shapes follow the window: a
        # symbolic window there made inductor's kernels corrupt the heap (a SmolLM2 run,
        # step 60). Its layers compile around the attention module, which runs eagerly.
        attention = {id(module) for _, module, _ in layers}
        blocks = [child for block in blocks for child in block.children()
                  if id(child) not in attention]
    try:
        for block in blocks:
            block.compile(dynamic=False)
        kl.compile_rows(True)
        # graphs per layer: the first layer's input needs no grad, the others' do; the window
        # is specialised at 0 and 1 and at its first value (then a graph input): more than
        # dynamo's default limit of 8, past which it would run the layers eagerly
        with torch._dynamo.config.patch(allow_unspec_int_on_nn_module=True,
                                        recompile_limit=64):
            yield
    finally:
        for block in blocks:
            block._compiled_call_impl = None
        kl.compile_rows(False)


def _teacher_name(teacher):
    if isinstance(teacher, TeacherCache):
        return f"cache k={teacher.k} ({teacher.precision})"
    return "model"


def _to(target, device):
    if target.index.device != device:
        target.index, target.logp, target.rest = (t.to(device) for t in
                                                  (target.index, target.logp, target.rest))
    return target


def _on(inputs, device):
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


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


def _check(steps, temperature, train, window_dropout, chunk, batches, max_seconds=None):
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
    if max_seconds is not None and (isinstance(max_seconds, bool) or not isinstance(
            max_seconds, (int, float)) or not max_seconds > 0):
        raise _core.Error(f"max_seconds: {max_seconds!r} must be a number > 0 (or None)")


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
