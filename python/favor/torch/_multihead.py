"""The multi-head machinery that favor's attention modules share (FavorAttention,
VQAttention): q/k/v/out projections, splitting and merging heads, forward and step. A
subclass supplies attend() (the core on [B, H, N, head_dim] tensors) and may hook
_prepare (before the core, training or not) and _learn (after a forward): FavorAttention's
hooks run its FavorCore, VQAttention's its VQCore (prepare, attend, learn;
_core_attributes.py)."""
import torch
from torch import nn

from .. import _core
from . import _tensors as T


class MultiHeadModule(nn.Module):
    def _init_heads(self, embed_dim, num_heads, causal, bias, kdim, vdim, device, dtype,
                    batch_first=True):
        if embed_dim % num_heads != 0:
            raise _core.Error(f"num_heads: {num_heads} must divide embed_dim = {embed_dim}")
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.causal, self.batch_first = causal, batch_first
        f = dict(device=device, dtype=dtype)
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **f)
        self.k_proj = nn.Linear(kdim or embed_dim, embed_dim, bias=bias, **f)
        self.v_proj = nn.Linear(vdim or embed_dim, embed_dim, bias=bias, **f)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **f)

    def _heads(self, x):
        b, n, _ = x.shape
        return x.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)  # a view, no copy

    def _merge(self, y):
        b, _, n, _ = y.shape
        return y.transpose(1, 2).reshape(b, n, self.embed_dim)

    def _prepare(self, k, key_padding_mask):
        """Called before attend() in forward(), with the keys [B, H, Nk, head_dim]."""

    def _learn(self, k, key_padding_mask):
        """Called after attend() in forward(), with the keys [B, H, Nk, head_dim]."""

    def forward(self, query, key=None, value=None, key_padding_mask=None):
        T.check_tensor(query, "query")
        if query.dim() != 3:
            raise _core.Error(f"query: shape {list(query.shape)} must be [B, N, embed_dim]"
                              + ("" if self.batch_first else " ([N, B, embed_dim] with "
                                 "batch_first=False)"))
        if key is not None and key is not query:
            _refuse_cross_window(self.core)
        key = query if key is None else key
        value = key if value is None else value
        if not self.batch_first:
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        q = self._heads(self.q_proj(query))
        k = self._heads(self.k_proj(key))
        v = self._heads(self.v_proj(value))
        self._prepare(k, key_padding_mask)
        y = self.out_proj(self._merge(self.attend(q, k, v, key_padding_mask)))
        self._learn(k, key_padding_mask)
        return y if self.batch_first else y.transpose(0, 1)

    @torch.no_grad()
    def step(self, x, decoder):
        """Causal self-attention of T new tokens x [B, T, E] given the earlier ones held by
        `decoder`; appends them. Equals forward() on the whole sequence (causal), row by
        row, at a cost per token that does not grow with the position."""
        if not self.batch_first:
            x = x.transpose(0, 1)
        q = self._heads(self.q_proj(x))
        k = self._heads(self.k_proj(x))
        v = self._heads(self.v_proj(x))
        if x.shape[1] == 1:
            decoder.append(k, v)
            y = decoder.query(q)
        else:
            if decoder.position != 0:
                raise _core.Error("x: several tokens at once only as the first call (prefill); "
                                  "after that give one token per step")
            y = self.attend(q, k, v, causal=True)
            decoder.append(k, v)
        y = self.out_proj(self._merge(y.to(x.dtype)))
        return y if self.batch_first else y.transpose(0, 1)


def _refuse_cross_window(core):
    """A window or sinks are positions in one sequence: cross-attention with them is refused
    (equal lengths would otherwise pass C++'s Nq == Nk rule)."""
    if getattr(core, "window", 0) or getattr(core, "sinks", 0):
        raise _core.Error("window, sinks: hybrid attention is self-attention (positions of "
                          "one sequence); this call attends to another key sequence")

