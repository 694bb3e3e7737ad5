"""Training a CharTransformer: the model presets, the learning-rate schedule, checkpoints
(written atomically; resumable bit for bit) and a Trainer that steps the model.

    model = CharTransformer(**MODEL_PRESETS["shakespeare"], vocab=data.vocab)
    t = Trainer(model, data, TrainConfig(), seed=0)
    while t.step < t.config.steps:
        loss = t.train_step()
    t.save("run.pt")                      # Trainer.resume("run.pt", data) continues it
"""
import dataclasses
import math
import os

import numpy as np
import torch
from torch.nn import functional as F

from .. import _core
from .char_transformer import CharTransformer, attention_spec, convert_attention
from .conversion import convert_method
from .presets import attention_preset  # noqa: F401 (favor.models.training.attention_preset)

# The model the baseline trains (examples/shakespeare/train.py's default): chosen so that
# TrainConfig's steps take about 25 minutes on 2 cores (examples/shakespeare/README.md).
MODEL_PRESETS = {
    "shakespeare": dict(d_model=128, heads=4, layers=4, context=256, dropout=0.0),
    "tiny": dict(d_model=32, heads=2, layers=2, context=32, dropout=0.0),
}


@dataclasses.dataclass
class TrainConfig:
    steps: int = 2500
    batch: int = 32
    lr: float = 3e-3
    warmup: int = 100
    min_lr: float = 3e-4          # the cosine ends here at `steps`
    weight_decay: float = 0.1     # on matrices and embeddings only
    grad_clip: float = 1.0
    eval_every: int = 250
    eval_windows: int = 64
    checkpoint_every: int = 250


def learning_rate(step, c):
    """Linear warmup over c.warmup steps to c.lr, then a cosine down to c.min_lr at c.steps."""
    if step < c.warmup:
        return c.lr * (step + 1) / c.warmup
    t = min(1.0, (step - c.warmup) / max(1, c.steps - c.warmup))
    return c.min_lr + 0.5 * (c.lr - c.min_lr) * (1.0 + math.cos(math.pi * t))


def make_optimizer(model, c):
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    rest = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": c.weight_decay},
                              {"params": rest, "weight_decay": 0.0}],
                             lr=c.lr, betas=(0.9, 0.95))


def save_checkpoint(path, state):
    """torch.save to path + '.tmp', then an atomic rename: a crash leaves the old file."""
    tmp = f"{path}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def kernel_fits(model):
    """The FAVOR++/FAVOR# fit of every attention layer as (a, basis) numpy arrays (None for a
    layer without one): what a checkpoint keeps besides the state_dict, since a KernelFit
    made from calibration text is configuration, not a parameter."""
    fits = []
    for attn in model.attentions():
        f = getattr(attn, "fit", None)
        fits.append(None if f is None else (np.asarray(f.a).copy(), np.asarray(f.basis).copy()))
    return fits if any(f is not None for f in fits) else None


def apply_kernel_fits(model, fits):
    """Puts kernel_fits(...) back into the attention layers of `model`."""
    if fits is None:
        return
    if len(fits) != len(model.blocks):
        raise _core.Error(f"fits: {len(fits)} entries for a model of {len(model.blocks)} layers")
    for attn, f in zip(model.attentions(), fits):
        if f is not None:
            attn.fit = _core.KernelFit(f[0], f[1])


def load_model(path, attention=None, calibration=None, seed=0):
    """(model, checkpoint dict) of a checkpoint (a Trainer's or a bare {config, model}),
    in eval mode, with its saved FAVOR++/# fits. `attention` converts it: a method name of
    favor.models.conversion (fitted on `calibration` ids where the method needs it, with
    `seed`) or a spec dict (convert_attention; VQ codebooks by k-means on `calibration`)."""
    ck = torch.load(path, map_location="cpu", weights_only=False)
    model = CharTransformer(**ck["config"])
    model.load_state_dict(ck["model"])
    apply_kernel_fits(model, ck.get("fits"))
    model.eval()
    if isinstance(attention, str):
        model, _ = convert_method(model, attention, calibration, seed=seed)
        model.eval()
    elif attention is not None:
        model = convert_attention(model, calibration=calibration, **attention_spec(attention))
    return model, ck


class Trainer:
    """Steps a CharTransformer on random training windows (data.batch with its own seeded
    generator), AdamW with learning_rate(step), cross-entropy plus the VQ commitment
    losses. The state (model, optimizer, step, generator and torch RNG states, config,
    extra) round-trips through save() / Trainer.resume(): the resumed run takes the same
    next steps."""

    def __init__(self, model, data, config, seed=0, extra=None):
        self.model, self.data, self.config, self.seed = model, data, config, seed
        self.optimizer = make_optimizer(model, config)
        self.generator = torch.Generator().manual_seed(seed + 1)
        self.step = 0
        self.extra = dict(extra or {})

    def train_step(self):
        """One optimiser step; returns the training cross-entropy (nats per character)."""
        c, model = self.config, self.model
        model.train()
        x, y = self.data.batch("train", c.batch, model.context, self.generator)
        lr = learning_rate(self.step, c)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        total = loss + model.aux_loss()
        self.optimizer.zero_grad(set_to_none=True)
        total.backward()
        if c.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), c.grad_clip)
        self.optimizer.step()
        self.step += 1
        return loss.item()

    def state(self):
        return dict(config=self.model.config, model=self.model.state_dict(),
                    optimizer=self.optimizer.state_dict(), step=self.step, seed=self.seed,
                    train=dataclasses.asdict(self.config), chars=self.data.chars,
                    rng=dict(data=self.generator.get_state(), torch=torch.get_rng_state()),
                    extra=self.extra, fits=kernel_fits(self.model))

    def save(self, path):
        save_checkpoint(path, self.state())

    @classmethod
    def resume(cls, path, data):
        ck = torch.load(path, map_location="cpu", weights_only=False)
        model = CharTransformer(**ck["config"])
        model.load_state_dict(ck["model"])
        apply_kernel_fits(model, ck.get("fits"))
        t = cls(model, data, TrainConfig(**ck["train"]), seed=ck["seed"], extra=ck.get("extra"))
        t.optimizer.load_state_dict(ck["optimizer"])
        t.step = ck["step"]
        t.generator.set_state(ck["rng"]["data"])
        torch.set_rng_state(ck["rng"]["torch"])
        return t
