"""favor.hf.finetune: stage 2 of attention transfer, a short training of a converted model
(every weight, or low-rank adapters with peft), on its own loss or against a teacher.

    losses = favor.hf.finetune(model, batches, steps=100, lr=1e-4)              # causal LM
    losses = favor.hf.finetune(model, batches, steps=100, lora=dict(r=8))       # adapters
    losses = favor.hf.finetune(encoder, batches, steps=100, teacher=original)   # distil
"""
import torch

from .. import _core
from . import adapters
from .convert import cores
from .distill import trainable
from .transfer import _bar, _inputs


def finetune(model, batches, *, steps, lr=1e-4, loss=None, teacher=None, lora=None, seed=0,
             clip=1.0, progress=True, keep_adapters=False):
    """Trains `model` (converted by favor.hf.convert) for `steps` AdamW steps over batches
    (cycled in order; dicts of model inputs or input_ids tensors). The loss: `loss(model,
    inputs) -> scalar` if given; else with `teacher` the mean squared error of the last
    hidden state against the teacher's (real tokens only); else the model's causal LM loss
    (labels = input_ids, padding ignored). (A decoder distils against its teacher's
    next-token distributions with favor.hf.distill.) lora: None (train every weight and the
    favor maps) or a dict of peft.LoraConfig options for favor.hf.add_adapters (r,
    lora_alpha, target_modules: default the family's attention projections); the adapters
    and the favor maps train, and at the end the adapters are merged into the weights, so
    the model stays a plain transformers model, unless keep_adapters (then
    favor.hf.save_pretrained writes the compact form). Returns the losses, one per step."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise _core.Error(f"steps: {steps!r} must be an integer >= 0")
    if not batches:
        raise _core.Error("batches: give at least one batch")
    if loss is None and teacher is None and model.get_output_embeddings() is None:
        raise _core.Error("loss: the model has no language-model head; give teacher= (an "
                          "encoder distils against it) or loss=")
    layers = cores(model)
    torch.manual_seed(seed)
    if lora is not None:
        adapters.add_adapters(model, **lora)
        params = [p for _, p in trainable(model, "lora", layers)]
    else:
        params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    bar = _bar(steps, progress, "favor.hf.finetune", "step")
    for step in range(steps):
        inputs = _inputs(batches[step % len(batches)])
        value = _loss(model, inputs, loss, teacher)
        opt.zero_grad()
        value.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        losses.append(float(value.detach()))
        if bar is not None:
            bar.set_postfix(loss=f"{losses[-1]:.4g}")
            bar.update(1)
    if bar is not None:
        bar.close()
    if lora is not None and not keep_adapters:
        adapters.merge_adapters(model)
    model.eval()
    return losses


def _loss(model, inputs, loss, teacher):
    if loss is not None:
        return loss(model, inputs)
    if teacher is not None:
        with torch.no_grad():
            ref = teacher(**inputs).last_hidden_state
        got = model(**inputs).last_hidden_state
        keep = inputs.get("attention_mask")
        w = torch.ones(got.shape[:2]) if keep is None else keep.to(got.dtype)
        return (((got - ref) ** 2).mean(-1) * w).sum() / w.sum()
    labels = inputs["input_ids"].clone()
    if inputs.get("attention_mask") is not None:
        labels[inputs["attention_mask"] == 0] = -100
    return model(**inputs, labels=labels, use_cache=False).loss  # no cache: nothing generated
