"""favor's codebook learning as torch ops on the codebook buffers (favor.torch.VQCore's, which
VQAttention and VQMultiheadAttention own), so a compiled or exported model carries it inside
its graph:

    favor::vq_assign             pure: the nearest code of every key, int64 [B, H, N]
    favor::codebook_initialise   k-means on the keys into codebook, ema_sum, ema_count,
                                 unused and initialised, unless initialised is set (the
                                 data-dependent branch lives inside the op)
    favor::codebook_ema_update   one EMA step with dead-code reset (favor's C++
                                 codebook_ema_update); returns the codes re-seeded
    favor::codebook_track_usage  learn_codebook='grad': the unused counters from the
                                 assignment, and dead codes moved onto keys of the batch

Keys k are [B, H, N, D] (any float dtype; read in float32), codebooks [H, c, D]; the buffers
are those VQCore registers. key_padding_mask is torch's convention (bool True =
ignore, or float 0 / -inf), read only inside the ops. The seed of an update is derived
inside from the `updates` counter tensor (favor._args.mix_seed), as the eager module did.
"""
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from ... import _core
from ..._args import mix_seed


def int64_seed(seed):
    """A seed in [0, 2^64) as the int64 a custom op's schema carries (two's complement); the
    ops take it back modulo 2^64."""
    s = int(seed) % 2**64
    return s - 2**64 if s >= 2**63 else s
from .. import _dispatch
from .. import _tensors as T


def _keep_rows(keep):
    """The flat [B * N] bool index of the kept keys, or None."""
    return None if keep is None else torch.from_numpy(keep.reshape(-1).copy())


@torch.library.custom_op("favor::vq_assign", mutates_args=(), device_types="cpu")
def vq_assign_op(k: Tensor, codebook: Tensor) -> Tensor:
    """The index of the nearest code of every key: int64 [B, H, N]."""
    T.follow_torch_threads()
    z = _core.vq_assign(T.view(k.to(torch.float32)), T.view(codebook.to(torch.float32)))[0]
    return torch.from_numpy(z).long()


@vq_assign_op.register_fake
def _(k, codebook):
    return k.new_empty(k.shape[:-1], dtype=torch.int64)


@torch.library.custom_op("favor::codebook_initialise", device_types="cpu",
                         mutates_args=("codebook", "ema_sum", "ema_count", "unused",
                                       "initialised"))
def codebook_initialise_op(k: Tensor, key_padding_mask: Optional[Tensor], codebook: Tensor,
                           ema_sum: Tensor, ema_count: Tensor, unused: Tensor,
                           initialised: Tensor, iterations: int, seed: int,
                           force: bool) -> None:
    """k-means++ and Lloyd (favor.Codebook.kmeans) on k, one codebook per head, masked keys
    left out, topped up with seeded Gaussian draws of the per-head mean and spread when
    there are fewer keys than codes. Does nothing when initialised is set, unless force."""
    if bool(initialised) and not force:
        return
    seed %= 2**64  # int64 in the schema; favor's seeds are unsigned 64-bit (int64_seed)
    T.follow_torch_threads()
    codes = codebook.shape[1]
    keys = k.detach().to(torch.float32)
    heads = keys.shape[1]
    rows = keys.permute(1, 0, 2, 3).reshape(heads, -1, keys.shape[-1])   # [H, B*N, D]
    keep = _keep_rows(T.keep_mask(key_padding_mask))
    if keep is not None:
        rows = rows[:, keep]
    if rows.shape[1] < codes:
        g = torch.Generator().manual_seed(seed)
        extra = codes - rows.shape[1]
        mean = rows.mean(1, keepdim=True) if rows.shape[1] else torch.zeros(heads, 1, rows.shape[2])
        spread = rows.std(1, keepdim=True) if rows.shape[1] > 1 else torch.ones_like(mean)
        noise = torch.randn(heads, extra, rows.shape[2], generator=g)
        rows = torch.cat([rows, mean + spread.clamp_min(1e-3) * noise], 1)
    book = _core.codebook_kmeans(np.ascontiguousarray(rows.unsqueeze(0).numpy()), codes,
                                 iterations=iterations, seed=seed)[0]
    values = torch.from_numpy(book)
    codebook.copy_(values)
    ema_sum.copy_(values)
    ema_count.fill_(1.0)
    unused.zero_()
    initialised.fill_(True)


@codebook_initialise_op.register_fake
def _(k, key_padding_mask, codebook, ema_sum, ema_count, unused, initialised, iterations, seed,
      force):
    return None


@torch.library.custom_op("favor::codebook_ema_update", device_types="cpu",
                         mutates_args=("codebook", "ema_sum", "ema_count", "unused"))
def codebook_ema_update_op(codebook: Tensor, ema_sum: Tensor, ema_count: Tensor, unused: Tensor,
                           k: Tensor, key_padding_mask: Optional[Tensor], updates: Tensor,
                           decay: float, dead_after: int, seed: int) -> Tensor:
    """One EMA step of the codebook towards the means of its keys; codes unused for
    dead_after batches re-seeded from keys (seed: mix_seed(seed, updates)). Returns the
    number of codes re-seeded, an int64 scalar."""
    T.follow_torch_threads()
    seed %= 2**64
    bufs = [codebook, ema_sum, ema_count]
    views = [b if b.dtype == torch.float32 and b.is_contiguous() else
             b.to(torch.float32).contiguous() for b in bufs]
    reset = _core.codebook_ema_update(
        *[T.view(x) for x in views], T.view(unused), T.view(k.detach().float()),
        decay=decay, dead_after=dead_after, seed=mix_seed(seed, int(updates)),
        key_mask=T.keep_mask(key_padding_mask))
    for b, x in zip(bufs, views):
        if x is not b:
            b.copy_(x)
    return torch.tensor(reset, dtype=torch.int64)


@codebook_ema_update_op.register_fake
def _(codebook, ema_sum, ema_count, unused, k, key_padding_mask, updates, decay, dead_after,
      seed):
    return codebook.new_empty((), dtype=torch.int64)


@torch.library.custom_op("favor::codebook_track_usage", device_types="cpu",
                         mutates_args=("codebook", "unused"))
def codebook_track_usage_op(codebook: Tensor, unused: Tensor, k: Tensor, z: Tensor,
                            key_padding_mask: Optional[Tensor], updates: Tensor,
                            dead_after: int, seed: int) -> Tensor:
    """learn_codebook='grad': unused[h, c] counts the consecutive batches no unmasked key of
    head h chose code c (z [B, H, N], vq_assign's codes); codes unused for dead_after
    batches (0: never) move onto distinct unmasked keys of this batch, drawn with the seed
    mix_seed(seed, updates). Returns the number of codes moved, an int64 scalar."""
    h, c = unused.shape
    seed %= 2**64
    keep = _keep_rows(T.keep_mask(key_padding_mask))
    counts = torch.zeros(h, c, dtype=torch.int64)
    for head in range(h):
        codes = z[:, head].reshape(-1)
        if keep is not None:
            codes = codes[keep]
        counts[head] = torch.bincount(codes, minlength=c)
    unused.copy_(torch.where(counts > 0, torch.zeros_like(unused), unused + 1))
    moved = 0
    if dead_after == 0:
        return torch.tensor(moved, dtype=torch.int64)
    g = torch.Generator().manual_seed(mix_seed(seed, int(updates)) % 2**63)
    for head in range(h):
        dead = (unused[head] >= dead_after).nonzero().flatten().tolist()
        if not dead:
            continue
        # Re-seeded from this batch's unmasked keys, distinct ones while there are enough
        # (as codebook_ema_update does).
        rows = k[:, head].detach().reshape(-1, k.shape[-1])
        if keep is not None:
            rows = rows[keep]
        if len(rows) == 0:
            continue
        order = torch.randperm(len(rows), generator=g)
        for i, code in enumerate(dead):
            codebook[head, code] = rows[order[i % len(rows)]]
            unused[head, code] = 0
            moved += 1
    return torch.tensor(moved, dtype=torch.int64)


@codebook_track_usage_op.register_fake
def _(codebook, unused, k, z, key_padding_mask, updates, dead_after, seed):
    return codebook.new_empty((), dtype=torch.int64)


# Other devices: codebook learning is small next to attention (one pass over the keys per
# step), so its ops run on the host by the same C++ rules and write back in place: the
# codebook a GPU model learns is the one a CPU model would learn, bit for bit.
for _op, _name, _mutated in (
        (vq_assign_op, "vq_assign", ()),
        (codebook_initialise_op, "codebook_initialise",
         ("codebook", "ema_sum", "ema_count", "unused", "initialised")),
        (codebook_ema_update_op, "codebook_ema_update", ("codebook", "ema_sum", "ema_count",
                                                         "unused")),
        (codebook_track_usage_op, "codebook_track_usage", ("codebook", "unused"))):
    _op.register_kernel(_dispatch.OTHER_DEVICES, _dispatch.on_host(_op, _name, _mutated))
