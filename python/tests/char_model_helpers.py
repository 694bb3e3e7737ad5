"""What the favor.models tests share: the first 60000 characters of tinyshakespeare and a
tiny CharTransformer trained 40 steps on them (seeded)."""
import os

import torch

from favor.models import CharData, CharTransformer
from favor.models.training import MODEL_PRESETS, TrainConfig, Trainer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHAKESPEARE = os.path.join(ROOT, "examples", "shakespeare")
TEXT = os.path.join(SHAKESPEARE, "data", "tinyshakespeare.txt")
TINY = MODEL_PRESETS["tiny"]


def tiny_data():
    with open(TEXT, encoding="utf-8") as f:
        return CharData(f.read()[:60000])


def tiny_trainer(data, steps=40):
    """A Trainer whose tiny model has taken `steps` steps (lr 1e-2, batch 16, seed 0), and
    the training losses of those steps."""
    torch.manual_seed(0)
    model = CharTransformer(vocab=data.vocab, **TINY)
    t = Trainer(model, data, TrainConfig(steps=steps, batch=16, lr=1e-2, warmup=5), seed=0)
    return t, [t.train_step() for _ in range(steps)]
