"""Character-level data: the vocabulary, a train/validation split, random context windows
and bits per character.

    data = CharData.from_file("examples/shakespeare/data/tinyshakespeare.txt")
    x, y = data.batch("train", 32, 256, generator)         # [32, 256] inputs and targets
    bpc = bits_per_char(model, data, "val", 256)           # a fixed set of windows
"""
import math

import torch
from torch.nn import functional as F

from .. import _core


class CharData:
    """The text as ids over its sorted set of characters; the first `train_fraction` of
    the characters is the training split, the rest the validation split (a contiguous
    split, as is usual for tinyshakespeare). chars: the vocabulary string (give the one a
    checkpoint recorded to encode new text the same way)."""

    def __init__(self, text, train_fraction=0.9, chars=None):
        self.chars = "".join(sorted(set(text))) if chars is None else chars
        self.index = {c: i for i, c in enumerate(self.chars)}
        ids = self.encode(text)
        cut = int(len(ids) * train_fraction)
        self.splits = {"train": ids[:cut], "val": ids[cut:]}

    @classmethod
    def from_file(cls, path, **kw):
        with open(path, encoding="utf-8") as f:
            return cls(f.read(), **kw)

    @property
    def vocab(self):
        return len(self.chars)

    def encode(self, text):
        missing = sorted(set(text) - set(self.index))
        if missing:
            raise _core.Error(f"text: characters {missing!r} are not in the vocabulary")
        return torch.tensor([self.index[c] for c in text], dtype=torch.long)

    def decode(self, ids):
        return "".join(self.chars[int(i)] for i in ids)

    def batch(self, split, batch, context, generator):
        """`batch` random windows of `context` characters from a split (starts drawn with
        `generator`, a torch.Generator): inputs x [B, context] and targets y = x shifted
        by one."""
        ids = self.splits[split]
        starts = torch.randint(0, len(ids) - context, (batch,), generator=generator)
        x = torch.stack([ids[s:s + context] for s in starts.tolist()])
        y = torch.stack([ids[s + 1:s + 1 + context] for s in starts.tolist()])
        return x, y

    def windows(self, split, context, count):
        """`count` fixed windows (starts evenly spaced over the split, no randomness):
        inputs and targets [count, context]."""
        ids = self.splits[split]
        last = len(ids) - context - 1
        if last < 0:
            raise _core.Error(f"context: {context} is longer than the {split} split")
        starts = torch.linspace(0, last, count).round().long().tolist()
        x = torch.stack([ids[s:s + context] for s in starts])
        y = torch.stack([ids[s + 1:s + 1 + context] for s in starts])
        return x, y


@torch.no_grad()
def bits_per_char(model, data, split="val", context=None, count=64, batch=16):
    """Bits per character of `model` on `count` fixed windows of the split (CharData.windows):
    the mean cross-entropy over every predicted character / ln 2. Eval mode (restored)."""
    context = context or model.context
    x, y = data.windows(split, context, count)
    was_training = model.training
    model.eval()
    total = 0.0
    for i in range(0, count, batch):
        logits = model(x[i:i + batch])
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y[i:i + batch].reshape(-1),
                                 reduction="sum").item()
    model.train(was_training)
    return total / y.numel() / math.log(2.0)
