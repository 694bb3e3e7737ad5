"""favor.hf.precision: the precision distill and the teacher cache run in. 'bf16' is torch's
autocast with the frozen Linear weights held in bfloat16 while it runs (no cast per op); what
trains stays float32 (the master copies the optimiser updates), and float32 is kept where
the math needs it:
- favor's attention computes in float32 (favor.hf.attention casts its inputs);
- the LoRA adapters being trained run in float32 beside their bfloat16 base layer, and their
  delta is added to the base's output in float32. Their delta starts at zero and stays small
  beside the base's output; added in bfloat16 (8 bits of mantissa) most of it is rounded
  away. Measured on SmolLM2-135M (docs/hf.md, "Distillation at scale"): with the adapters in
  bfloat16, 30 steps reached a held-out KL 4% above float32's; in float32, within 1%.
'auto' picks bf16 where it is fast: a CUDA device with bf16, or a CPU where
favor.bf16_available() (AVX512-BF16, which AMX machines also have, and FAVOR_CPU not capping
it); else float32."""
import contextlib

import torch

from .. import _core

CHOICES = ("auto", "bf16", "float32")


def resolve(precision, device):
    """'bf16' or 'float32' for `precision` (one of CHOICES) on `device` (a torch.device)."""
    if precision not in CHOICES:
        raise _core.Error(f"precision: {precision!r} is not one of {', '.join(CHOICES)}")
    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "float32"
    return "bf16" if _core.bf16_available() else "float32"


@contextlib.contextmanager
def low_precision(on, *models, frozen_only=True):
    """With on: the models' Linear weights (those that do not require grad, or all of them
    with frozen_only=False; never a weight an Embedding shares) in bfloat16 and autocast to
    bfloat16 on the first model's device; the float32 weights are put back at exit, bit for
    bit. Nested use is free (weights already in bfloat16 are left)."""
    if not on or not models:
        yield
        return
    saved = []
    try:
        for model in models:
            tied = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
            for m in model.modules():
                p = getattr(m, "weight", None) if isinstance(m, torch.nn.Linear) else None
                if p is None or id(p) in tied or p.dtype != torch.float32 or \
                        (frozen_only and p.requires_grad):
                    continue
                saved.append((p, p.data))
                p.data = p.data.to(torch.bfloat16)
        device = next(models[0].parameters()).device.type
        for model in models:
            for m in model.modules():
                if _trained_lora(m):
                    saved.append((m, None))
                    m.forward = _float32_adapters(m, device)
        with torch.autocast(device, dtype=torch.bfloat16):
            yield
    finally:
        for p, data in saved:
            if data is None:
                del p.forward  # the module's own forward again
            else:
                p.data = data


def _trained_lora(module):
    from peft.tuners.lora import LoraLayer
    return isinstance(module, LoraLayer) and "forward" not in module.__dict__ and any(
        p.requires_grad for p in module.lora_A.parameters())


def _float32_adapters(module, device):
    """peft's LoRA forward with the adapters' products and their sum in float32 (the base
    layer under autocast). DoRA and other variants, merged or disabled adapters, and mixed
    batches take peft's own forward."""
    own = type(module).forward.__get__(module)

    def forward(x, *args, **kwargs):
        active = [a for a in module.active_adapters if a in module.lora_A]
        if module.merged or module.disable_adapters or "adapter_names" in kwargs or any(
                a in module.lora_variant for a in active):
            return own(x, *args, **kwargs)
        result = module.base_layer(x, *args, **kwargs)
        with torch.autocast(device, enabled=False):
            result, x = result.float(), x.float()
            for a in active:
                delta = module.lora_B[a](module.lora_A[a](module.lora_dropout[a](x)))
                result = result + delta * module.scaling[a]
        return result
    return forward
