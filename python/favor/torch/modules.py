"""favor.torch.FavorAttention: multi-head FAVOR attention as a module."""
import torch
from torch import nn

from .. import _core
from ..api import _fit
from . import _tensors as T
from ._projection import ProjectionMixin
from .decoder import Decoder
from .function import attention


class FavorAttention(ProjectionMixin, nn.Module):
    """Multi-head attention with FAVOR: q/k/v/out projections, heads, a causal flag.

    FavorAttention(embed_dim, num_heads, *, causal=False, kernel='positive', features=256,
                   projection='orthogonal', norms='chi', seed=0, feature_redraw_interval=None,
                   learn_projection=False, method='favor', scale=None, fit=None, bias=True,
                   kdim=None, vdim=None, device=None, dtype=None)

    forward(query [B, Nq, E], key=None, value=None, key_padding_mask=None) -> [B, Nq, E]
    (self-attention when key and value are None; key_padding_mask [B, Nk], True = ignore).
    One projection W [features, E / num_heads] shared by the heads, kept in the buffer
    `projection` (a Parameter with learn_projection=True, trained through dL/dW).
    method='exact' runs favor's exact softmax attention with the same weights.
    For generation: decoder(batch) and step(x, decoder).
    """

    def __init__(self, embed_dim, num_heads, *, causal=False, kernel="positive", features=256,
                 projection="orthogonal", norms="chi", seed=0, feature_redraw_interval=None,
                 learn_projection=False, method="favor", scale=None, fit=None, bias=True,
                 kdim=None, vdim=None, device=None, dtype=None):
        super().__init__()
        if embed_dim % num_heads != 0:
            raise _core.Error(f"num_heads: {num_heads} must divide embed_dim = {embed_dim}")
        if method not in ("favor", "exact"):
            raise _core.Error(f"method: '{method}' is not a method; use favor or exact")
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.causal, self.kernel, self.method, self.scale = causal, kernel, method, scale
        self.fit = _fit(fit, kernel, self.head_dim)
        f = dict(device=device, dtype=dtype)
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **f)
        self.k_proj = nn.Linear(kdim or embed_dim, embed_dim, bias=bias, **f)
        self.v_proj = nn.Linear(vdim or embed_dim, embed_dim, bias=bias, **f)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **f)
        self._init_projection(features, self.head_dim, projection, norms, seed,
                              learn_projection, feature_redraw_interval, device, dtype)

    def _heads(self, x):
        b, n, _ = x.shape
        return x.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)  # a view, no copy

    def _merge(self, y):
        b, _, n, _ = y.shape
        return y.transpose(1, 2).reshape(b, n, self.embed_dim)

    def attend(self, q, k, v, key_padding_mask=None, causal=None):
        """The attention core on [B, H, N, head_dim] tensors (no in/out projections)."""
        return attention(q, k, v, causal=self.causal if causal is None else causal,
                         kernel=self.kernel, projection=self.projection, scale=self.scale,
                         key_padding_mask=key_padding_mask, fit=self.fit, method=self.method)

    def forward(self, query, key=None, value=None, key_padding_mask=None):
        T.check_tensor(query, "query")
        if query.dim() != 3:
            raise _core.Error(f"query: shape {list(query.shape)} must be [B, N, embed_dim]")
        key = query if key is None else key
        value = key if value is None else value
        self._maybe_redraw()
        q = self._heads(self.q_proj(query))
        k = self._heads(self.k_proj(key))
        v = self._heads(self.v_proj(value))
        return self.out_proj(self._merge(self.attend(q, k, v, key_padding_mask)))

    def decoder(self, batch):
        """A streaming state for generation with step(): favor.torch.Decoder over this
        module's heads, projection, kernel and scale."""
        if self.method != "favor":
            raise _core.Error("decoder: method='exact' has no fixed-size state; use favor")
        return Decoder(batch, self.num_heads, self.head_dim, self.projection,
                       kernel=self.kernel, scale=self.scale, fit=self.fit)

    @torch.no_grad()
    def step(self, x, decoder):
        """Causal self-attention of T new tokens x [B, T, E] given the earlier ones held by
        `decoder`; appends them. Equals forward() on the whole sequence (causal), row by
        row, at O(features * head_dim) per token and head."""
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
        return self.out_proj(self._merge(y.to(x.dtype)))

    def extra_repr(self):
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, causal={self.causal}, "
                f"kernel={self.kernel}, features={self.features}, "
                f"projection={self.projection_kind}, method={self.method}")

