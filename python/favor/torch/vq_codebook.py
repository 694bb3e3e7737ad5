"""The codebook state that favor's Transformer-VQ modules carry (VQAttention, and
VQMultiheadAttention for convert): buffers, k-means initialisation on the first batch, EMA
updates with dead-code reset (favor's C++ codebook_ema_update on the buffers), or gradient
learning, and the commitment loss."""
import math

import numpy as np
import torch
from torch import nn

from .. import _core
from .._args import block_length, mix_seed
from . import _tensors as T
from .vq_function import VQDecoder, vq_attention

LEARN = ("ema", "grad")


class CodebookMixin:
    """For modules with heads and head_dim; adds the buffers codebook [H, c, head_dim]
    (a Parameter with learn_codebook='grad'), ema_sum, ema_count [H, c], unused [H, c]
    (int64: consecutive training batches each code got no key), initialised and updates.
    All are in the state_dict, so a trained model reloads without re-initialising."""

    def _init_codebook(self, codes, *, tau, decay, dead_after, beta, learn_codebook, seed,
                       block, kmeans_iterations=25, device=None):
        if isinstance(codes, bool) or not isinstance(codes, int) or codes < 1:
            raise _core.Error(f"codes: {codes!r} must be an integer >= 1")
        if learn_codebook not in LEARN:
            raise _core.Error(f"learn_codebook: '{learn_codebook}' must be 'ema' or 'grad'")
        if not 0.0 < decay < 1.0:
            raise _core.Error(f"decay: {decay} must be in (0, 1)")
        if isinstance(dead_after, bool) or not isinstance(dead_after, int) or dead_after < 0:
            raise _core.Error(f"dead_after: {dead_after!r} must be an integer >= 0 (0: never)")
        if not (math.isfinite(beta) and beta >= 0):
            raise _core.Error(f"beta: {beta} must be finite and >= 0")
        if not (math.isfinite(tau) and tau >= 0):
            raise _core.Error(f"tau: {tau} must be finite and >= 0 (0: hard VQ)")
        self.codes, self.tau, self.decay, self.dead_after = codes, float(tau), decay, dead_after
        self.beta, self.learn_codebook, self.seed = beta, learn_codebook, seed
        block_length(block)  # validates now; vq_attention takes None or the length
        self.block, self.kmeans_iterations = block, kmeans_iterations
        shape = (self.num_heads, codes, self.head_dim)
        book = torch.zeros(shape, device=device, dtype=torch.float32)
        if learn_codebook == "grad":
            self.codebook = nn.Parameter(book)
        else:
            self.register_buffer("codebook", book)
        self.register_buffer("ema_sum", torch.zeros(shape, device=device))
        self.register_buffer("ema_count", torch.zeros(shape[:2], device=device))
        self.register_buffer("unused", torch.zeros(shape[:2], dtype=torch.int64, device=device))
        self.register_buffer("initialised", torch.tensor(False, device=device))
        self.register_buffer("updates", torch.tensor(0, dtype=torch.int64, device=device))
        self.commitment_loss = None
        self.codes_reset = 0

    # ------------------------------------------------------------------ initialisation

    @torch.no_grad()
    def initialise_codebook(self, k, key_padding_mask=None):
        """k-means++ and Lloyd (favor.Codebook.kmeans) on keys k [B, H, N, head_dim], one
        codebook per head; masked keys are left out. With fewer keys than codes the keys are
        topped up with Gaussian draws of the same per-head mean and spread (seeded)."""
        keys = k.detach().to(torch.float32)
        keep = T.keep_mask(key_padding_mask)
        heads = keys.shape[1]
        rows = keys.permute(1, 0, 2, 3).reshape(heads, -1, keys.shape[-1])   # [H, B*N, D]
        if keep is not None:
            rows = rows[:, torch.from_numpy(keep.reshape(-1).copy())]
        if rows.shape[1] < self.codes:
            g = torch.Generator().manual_seed(self.seed)
            extra = self.codes - rows.shape[1]
            mean = rows.mean(1, keepdim=True) if rows.shape[1] else torch.zeros(heads, 1, rows.shape[2])
            spread = rows.std(1, keepdim=True) if rows.shape[1] > 1 else torch.ones_like(mean)
            noise = torch.randn(heads, extra, rows.shape[2], generator=g)
            rows = torch.cat([rows, mean + spread.clamp_min(1e-3) * noise], 1)
        book = _core.codebook_kmeans(np.ascontiguousarray(rows.unsqueeze(0).numpy()), self.codes,
                                     iterations=self.kmeans_iterations, seed=self.seed)[0]
        values = torch.from_numpy(book).to(self.codebook.device)
        self.codebook.data.copy_(values)
        self.ema_sum.copy_(values)
        self.ema_count.fill_(1.0)
        self.unused.zero_()
        self.initialised.fill_(True)

    def _prepare(self, k, key_padding_mask):
        if not bool(self.initialised):
            self.initialise_codebook(k, key_padding_mask)

    # ------------------------------------------------------------------ attention

    def attend(self, q, k, v, key_padding_mask=None, causal=None):
        """The attention core on [B, H, N, head_dim] tensors (no in/out projections)."""
        if not bool(self.initialised):
            raise _core.Error("codebook: not initialised; run a forward pass (k-means on its "
                              "keys) or initialise_codebook(k) first")
        book = self.codebook
        if self.training:
            # The EMA update (or, learning by gradient, a dead-code reset) after this forward
            # changes the codebook in place; the backward must see the one this forward used.
            # A clone of the Parameter still passes the gradient on to it.
            book = book.detach().clone() if self.learn_codebook == "ema" else book.clone()
        return vq_attention(q, k, v, book, causal=self.causal if causal is None else causal,
                            scale=self.scale, key_padding_mask=key_padding_mask, tau=self.tau,
                            block=self.block)

    # ------------------------------------------------------------------ learning

    def _learn(self, k, key_padding_mask):
        keep = T.keep_mask(key_padding_mask)
        z = torch.from_numpy(_core.vq_assign(T.view(k.detach().to(torch.float32)),
                                             T.view(self.codebook.detach().float()))[0]).long()
        self.commitment_loss = self._commitment(k, z, keep)
        if self.training:
            if self.learn_codebook == "ema":
                self._ema_update(k, keep)
            else:
                self._track_usage(k, z, keep)
            self.updates += 1

    def _commitment(self, k, z, keep):
        """beta * mean_j |k_j - sg(C_z_j)|^2 (plus, when learning the codebook by gradient,
        the codebook loss mean_j |sg(k_j) - C_z_j|^2 that pulls codes to their keys)."""
        b, h, n, d = k.shape
        book = self.codebook.to(k.dtype).unsqueeze(0).expand(b, h, -1, -1)
        cz = torch.gather(book, 2, z.unsqueeze(-1).expand(b, h, n, d))
        weight = torch.ones(b, 1, n, dtype=k.dtype) if keep is None else \
            torch.from_numpy(keep).to(k.dtype).unsqueeze(1)
        weight = weight.expand(b, h, n) / (weight.sum() * h).clamp_min(1)
        loss = self.beta * (((k - cz.detach()) ** 2).sum(-1) * weight).sum()
        if self.learn_codebook == "grad":
            loss = loss + (((k.detach() - cz) ** 2).sum(-1) * weight).sum()
        return loss

    @torch.no_grad()
    def _ema_update(self, k, keep):
        bufs = [self.codebook, self.ema_sum, self.ema_count]
        views = [b if b.dtype == torch.float32 and b.is_contiguous() else
                 b.to(torch.float32).contiguous() for b in bufs]
        reset = _core.codebook_ema_update(
            *[T.view(x) for x in views], T.view(self.unused), T.view(k.detach().float()),
            decay=self.decay, dead_after=self.dead_after,
            seed=mix_seed(self.seed, int(self.updates)), key_mask=keep)
        for b, x in zip(bufs, views):
            if x is not b:
                b.copy_(x)
        self.codes_reset += reset

    @torch.no_grad()
    def _track_usage(self, k, z, keep):
        """learn_codebook='grad': the unused counters from the assignment, and codes unused
        for dead_after batches moved onto keys of this batch."""
        h, c = self.unused.shape
        counts = torch.zeros(h, c, dtype=torch.int64)
        for head in range(h):
            codes = z[:, head].reshape(-1)
            if keep is not None:
                codes = codes[torch.from_numpy(keep.reshape(-1).copy())]
            counts[head] = torch.bincount(codes, minlength=c)
        self.unused.copy_(torch.where(counts > 0, torch.zeros_like(self.unused), self.unused + 1))
        if self.dead_after == 0:
            return
        g = torch.Generator().manual_seed(mix_seed(self.seed, int(self.updates)) % 2**63)
        for head in range(h):
            dead = (self.unused[head] >= self.dead_after).nonzero().flatten().tolist()
            if not dead:
                continue
            # Re-seeded from this batch's unmasked keys, distinct ones while there are enough
            # (as codebook_ema_update does).
            rows = k[:, head].detach().reshape(-1, k.shape[-1])
            if keep is not None:
                rows = rows[torch.from_numpy(keep.reshape(-1).copy())]
            if len(rows) == 0:
                continue
            order = torch.randperm(len(rows), generator=g)
            for i, code in enumerate(dead):
                self.codebook.data[head, code] = rows[order[i % len(rows)]]
                self.unused[head, code] = 0
                self.codes_reset += 1

    # ------------------------------------------------------------------ inspection, decoding

    def dead_codes(self):
        """Codes (over all heads) that no key of the latest training batch was assigned to."""
        return int((self.unused > 0).sum())

    def decoder(self, batch):
        """A streaming state for generation with step(): favor.torch.VQDecoder over this
        module's heads, codebook, scale and tau."""
        if not bool(self.initialised):
            raise _core.Error("codebook: not initialised; run a forward pass first")
        return VQDecoder(batch, self.num_heads, self.head_dim, self.codebook.detach(),
                         scale=self.scale, tau=self.tau)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        # A state_dict of torch's nn.MultiheadAttention has no codebook: it is initialised by
        # k-means on the first batch.
        for name in ("codebook", "ema_sum", "ema_count", "unused", "initialised", "updates"):
            if prefix + name in missing_keys:
                missing_keys.remove(prefix + name)
