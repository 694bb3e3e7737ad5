"""favor.torch.VQCore: the Transformer-VQ attention core of a multi-head layer, on [B, H, N,
head_dim] tensors, with the codebook state it learns: buffers, k-means initialisation on the
first batch, EMA updates with dead-code reset (favor's C++ codebook_ema_update on the
buffers) or gradient learning, and the commitment loss.

favor's layers own one as `core` (VQAttention, VQMultiheadAttention: favor/torch/
_core_attributes.py) after their q/k/v projections; any other attention class can do the
same after its own projections and rotary embeddings (a Hugging Face attention class):

    core = VQCore(num_heads=8, head_dim=64, codes=256, causal=True)
    y = core(q, k, v, key_padding_mask=pad)    # q [B, H, Nq, 64], k, v [B, H, Nk, 64]
    loss = loss + core.commitment_loss

Tensors (H = num_heads, c = codes, D = head_dim; in the state_dict under the owner's
prefix, e.g. `core.codebook`): codebook [H, c, D] (a Parameter with learn_codebook='grad'),
ema_sum [H, c, D], ema_count [H, c], unused [H, c] (int64: consecutive training batches each
code got no key), initialised (bool), updates (int64). A state_dict without them (torch's
nn.MultiheadAttention, a Hugging Face checkpoint) loads, and the codebook is initialised by
k-means on the first batch. The learning steps are the ops of favor/ops/codebook, so
torch.compile(fullgraph=True) and torch.export trace them.
"""
import math

import torch
from torch import nn

from .. import _core
from .._args import block_length
from ..ops.codebook import (codebook_ema_update_op, codebook_initialise_op,
                            codebook_track_usage_op, int64_seed, vq_assign_op)
from ._attention_core import AttentionCore
from . import _tensors as T
from .vq_function import VQDecoder, vq_attention

LEARN = ("ema", "grad")
_TENSORS = ("codebook", "ema_sum", "ema_count", "unused", "initialised", "updates")


class VQCore(AttentionCore):
    """Transformer-VQ attention on [B, H, N, head_dim] tensors, without in/out projections.

    VQCore(num_heads, head_dim, codes, *, causal=False, tau=0.0, decay=0.99, dead_after=50,
           beta=0.25, learn_codebook='ema', scale=None, block=None, seed=0,
           kmeans_iterations=25, device=None)

    forward(q [B, H, Nq, D], k [B, H, Nk, D], v [B, H, Nk, Dv], key_padding_mask=None
    [B, Nk] (True = ignore), causal=None (None: the core's `causal`)) -> [B, H, Nq, Dv]:
    prepare(k, key_padding_mask) (k-means on the keys of the first call), attend(...)
    (favor.torch.vq_attention over the codebook), learn(k, key_padding_mask) (the commitment
    loss; in training, the EMA update or, with learn_codebook='grad', the dead-code reset).
    A layer calls the three itself, from its own hooks.
    After each forward, `commitment_loss` is beta * mean |k - sg(C_z)|^2 (a differentiable
    scalar; 'grad' adds mean |sg(k) - C_z|^2): add it to the training loss. tau > 0: soft
    VQ. initialise_codebook(k) runs k-means now; dead_codes(): codes no key of the latest
    training batch chose; codes_reset: codes re-seeded so far; decoder(batch): a
    favor.torch.VQDecoder for generation. `method` is 'vq'.
    """

    method = "vq"
    TENSORS = _TENSORS

    def __init__(self, num_heads, head_dim, codes, *, causal=False, tau=0.0, decay=0.99,
                 dead_after=50, beta=0.25, learn_codebook="ema", scale=None, block=None, seed=0,
                 kmeans_iterations=25, device=None, backend=None):
        super().__init__()
        self.backend = T.check_backend(backend)
        self.num_heads, self.head_dim, self.causal, self.scale = num_heads, head_dim, causal, scale
        self._init_codebook(codes, tau=tau, decay=decay, dead_after=dead_after, beta=beta,
                            learn_codebook=learn_codebook, seed=seed, block=block,
                            kmeans_iterations=kmeans_iterations, device=device)

    def _init_codebook(self, codes, *, tau, decay, dead_after, beta, learn_codebook, seed,
                       block, kmeans_iterations, device):
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
        self.register_buffer("resets", torch.tensor(0, dtype=torch.int64, device=device),
                             persistent=False)
        self.commitment_loss = None

    # ------------------------------------------------------------------ initialisation

    @torch.no_grad()
    def initialise_codebook(self, k, key_padding_mask=None):
        """k-means++ and Lloyd (favor.Codebook.kmeans) on keys k [B, H, N, head_dim], one
        codebook per head; masked keys are left out. With fewer keys than codes the keys are
        topped up with Gaussian draws of the same per-head mean and spread (seeded)."""
        self._initialise(k, key_padding_mask, force=True)

    @staticmethod
    def _mask(k, key_padding_mask):
        """key_padding_mask after the rules that need no values: a bool or float tensor of
        shape [B, Nk] for keys k [B, H, Nk, D] (C++'s rule, favor.Error naming it)."""
        m = T.check_mask(key_padding_mask)
        if m is not None and not torch.compiler.is_compiling():  # (traced: shapes are fixed)
            _core.check_key_mask_shape(list(m.shape), k.shape[0], k.shape[-2], "Nk",
                                       argument="key_padding_mask")
        return m

    def _initialise(self, k, key_padding_mask, force):
        # The op (favor::codebook_initialise) decides from the `initialised` buffer: a
        # compiled graph carries the first-batch initialisation without a branch on data.
        codebook_initialise_op(k.detach(), self._mask(k, key_padding_mask), self.codebook,
                               self.ema_sum, self.ema_count, self.unused, self.initialised,
                               self.kmeans_iterations, int64_seed(self.seed), force)

    # ------------------------------------------------------------------ attention

    def forward(self, q, k, v, key_padding_mask=None, causal=None):
        self.prepare(k, key_padding_mask)
        y = self.attend(q, k, v, key_padding_mask, causal)
        self.learn(k, key_padding_mask)
        return y

    @torch.no_grad()
    def prepare(self, k, key_padding_mask=None):
        """Before attend(), with the keys [B, H, Nk, D]: k-means on them unless the codebook
        is initialised (the op decides, from the `initialised` buffer)."""
        self._initialise(k, key_padding_mask, force=False)

    def attend(self, q, k, v, key_padding_mask=None, causal=None):
        """favor.torch.vq_attention on [B, H, N, D] tensors over this core's codebook."""
        # Traced, forward() has just initialised the codebook (and the check would read data).
        if not torch.compiler.is_compiling() and not bool(self.initialised):
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
                            block=self.block, backend=self.backend)

    # ------------------------------------------------------------------ learning

    def learn(self, k, key_padding_mask=None):
        """After attend(), with the same keys: `commitment_loss`, and in training the EMA
        update (learn_codebook='ema') or the dead-code reset ('grad') of the codebook."""
        self._mask(k, key_padding_mask)
        z = vq_assign_op(k.detach(), self.codebook.detach())
        if not torch.compiler.is_exporting():
            # (An exported program has no place for it: torch.export drops the attribute.)
            self.commitment_loss = self._commitment(k, z, T.keep_tensor(key_padding_mask))
        if self.training:
            mask = T.check_mask(key_padding_mask)
            with torch.no_grad():
                if self.learn_codebook == "ema":
                    reset = codebook_ema_update_op(
                        self.codebook, self.ema_sum, self.ema_count, self.unused, k.detach(),
                        mask, self.updates, self.decay, self.dead_after, int64_seed(self.seed))
                else:
                    reset = codebook_track_usage_op(self.codebook, self.unused, k.detach(), z,
                                                    mask, self.updates, self.dead_after,
                                                    int64_seed(self.seed))
                self.resets += reset
                self.updates += 1

    def _commitment(self, k, z, keep):
        """beta * mean_j |k_j - sg(C_z_j)|^2 (plus, when learning the codebook by gradient,
        the codebook loss mean_j |sg(k_j) - C_z_j|^2 that pulls codes to their keys)."""
        b, h, n, d = k.shape
        book = self.codebook
        if self.training and self.learn_codebook == "grad":
            book = book.clone()  # the dead-code reset after this changes the Parameter in place
        book = book.to(k.dtype).unsqueeze(0).expand(b, h, -1, -1)
        cz = torch.gather(book, 2, z.unsqueeze(-1).expand(b, h, n, d))
        weight = torch.ones(b, 1, n, dtype=k.dtype) if keep is None else \
            keep.to(k.dtype).unsqueeze(1)
        weight = weight.expand(b, h, n) / (weight.sum() * h).clamp_min(1)
        loss = self.beta * (((k - cz.detach()) ** 2).sum(-1) * weight).sum()
        if self.learn_codebook == "grad":
            loss = loss + (((k.detach() - cz) ** 2).sum(-1) * weight).sum()
        return loss

    @property
    def codes_reset(self):
        """The codes re-seeded (EMA) or moved (learning by gradient) so far, an int (the
        non-persistent int64 buffer `resets`, which a compiled graph updates)."""
        return int(self.resets)

    @codes_reset.setter
    def codes_reset(self, value):
        self.resets.fill_(int(value))

    # ------------------------------------------------------------------ inspection, decoding

    def dead_codes(self):
        """Codes (over all heads) that no key of the latest training batch was assigned to."""
        return int((self.unused > 0).sum())

    def decoder(self, batch):
        """A streaming state for generation with a layer's step(): favor.torch.VQDecoder over
        this core's heads, codebook, scale and tau."""
        if not bool(self.initialised):
            raise _core.Error("codebook: not initialised; run a forward pass first")
        return VQDecoder(batch, self.num_heads, self.head_dim, self.codebook.detach(),
                         scale=self.scale, tau=self.tau, backend=self.backend)

    def extra_repr(self):
        return (f"num_heads={self.num_heads}, head_dim={self.head_dim}, codes={self.codes}, "
                f"causal={self.causal}, tau={self.tau}, learn_codebook={self.learn_codebook}")
