"""torch.nn.MultiheadAttention's interface without its attention: the shell that favor's
drop-ins share (favor.torch.MultiheadAttention around a FavorCore, VQMultiheadAttention
around a VQCore): torch's parameters and names (so an nn.MultiheadAttention's state_dict
loads), the in-projection, forward's signature and layouts, and the refusals of what favor
cannot do. A subclass owns the core (its hooks _prepare, attend, _learn:
_core_attributes.py)."""
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from .. import _core
from . import _tensors as T
from .masks import resolve_causal


class _DefaultTrue:
    """need_weights' default: torch's is True, which every caller that does not read the
    weights leaves as it is; telling it from an explicit True lets favor refuse only a real
    request (mha.py forward)."""

    def __bool__(self):
        return True

    def __repr__(self):
        return "True"


_NEED_WEIGHTS = _DefaultTrue()


class TorchMultihead(nn.Module):
    """torch.nn.MultiheadAttention's parameters, checks and forward; the attention is the
    subclass's (attend on [B, H, N, head_dim] between the hooks _prepare and _learn).

    TorchMultihead(embed_dim, num_heads, dropout, bias, add_bias_kv, add_zero_attn, kdim,
                   vdim, batch_first, device, dtype, warn_dropout, causal)
    """

    __constants__ = ["batch_first"]

    def __init__(self, embed_dim, num_heads, dropout, bias, add_bias_kv, add_zero_attn, kdim,
                 vdim, batch_first, device, dtype, warn_dropout, causal):
        super().__init__()
        if embed_dim % num_heads != 0:
            raise _core.Error(f"num_heads: {num_heads} must divide embed_dim = {embed_dim}")
        if add_bias_kv or add_zero_attn:
            raise _core.Error("add_bias_kv / add_zero_attn: not supported by favor's "
                              "MultiheadAttention (they append a key that breaks causal "
                              "attention); leave them False")
        if dropout > 0 and warn_dropout:
            warnings.warn(f"favor.torch.{type(self).__name__}: dropout={dropout} on the "
                          "attention weights is not applied (favor never forms them)",
                          stacklevel=3)
        f = dict(device=device, dtype=dtype)
        self.embed_dim, self.num_heads, self.dropout = embed_dim, num_heads, dropout
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._same_dims = self.kdim == embed_dim and self.vdim == embed_dim
        self.head_dim = embed_dim // num_heads
        self.batch_first, self.causal = batch_first, causal
        if self._same_dims:
            self.in_proj_weight = nn.Parameter(torch.empty(3 * embed_dim, embed_dim, **f))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        else:
            self.q_proj_weight = nn.Parameter(torch.empty(embed_dim, embed_dim, **f))
            self.k_proj_weight = nn.Parameter(torch.empty(embed_dim, self.kdim, **f))
            self.v_proj_weight = nn.Parameter(torch.empty(embed_dim, self.vdim, **f))
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = nn.Parameter(torch.empty(3 * embed_dim, **f))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **f)
        self.bias_k = self.bias_v = None
        self.add_zero_attn = False
        self._reset_parameters()

    @property
    def _qkv_same_embed_dim(self):
        """Always False. torch's TransformerEncoderLayer and TransformerEncoder read this
        attribute of their self_attn to decide whether to take their fused fast path, which
        computes softmax attention from in_proj_weight itself and would bypass this module
        (torch 1.13 and 2.x); False sends them through self_attn(...), that is, favor."""
        return False

    def _reset_parameters(self):  # as torch.nn.MultiheadAttention's
        if self._same_dims:
            nn.init.xavier_uniform_(self.in_proj_weight)
        else:
            nn.init.xavier_uniform_(self.q_proj_weight)
            nn.init.xavier_uniform_(self.k_proj_weight)
            nn.init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            nn.init.constant_(self.in_proj_bias, 0.0)
            nn.init.constant_(self.out_proj.bias, 0.0)

    @classmethod
    def from_torch(cls, mha, **options):
        """This layer with the configuration, trained weights, dtype and train/eval mode of
        a torch.nn.MultiheadAttention; options as the constructor's keywords."""
        if not isinstance(mha, nn.MultiheadAttention):
            raise _core.Error(f"mha: expected a torch.nn.MultiheadAttention, got "
                              f"{type(mha).__name__}")
        ref = mha.in_proj_weight if mha._qkv_same_embed_dim else mha.q_proj_weight
        T.check_tensor(ref, "mha's weights")
        options.setdefault("warn_dropout", False)
        new = cls(mha.embed_dim, mha.num_heads, dropout=mha.dropout,
                  bias=mha.in_proj_bias is not None, add_bias_kv=mha.bias_k is not None,
                  add_zero_attn=mha.add_zero_attn, kdim=mha.kdim, vdim=mha.vdim,
                  batch_first=mha.batch_first, dtype=ref.dtype, **options)
        new.load_state_dict(mha.state_dict())
        new.train(mha.training)
        return new

    def _in_projection(self, query, key, value):
        e = self.embed_dim
        b = self.in_proj_bias
        bq, bk, bv = (None, None, None) if b is None else (b[:e], b[e:2 * e], b[2 * e:])
        if self._same_dims:
            w = self.in_proj_weight
            if query is key and key is value:  # self-attention: one GEMM
                return F.linear(query, w, b).chunk(3, dim=-1)
            return (F.linear(query, w[:e], bq), F.linear(key, w[e:2 * e], bk),
                    F.linear(value, w[2 * e:], bv))
        return (F.linear(query, self.q_proj_weight, bq), F.linear(key, self.k_proj_weight, bk),
                F.linear(value, self.v_proj_weight, bv))

    def forward(self, query, key, value, key_padding_mask=None, need_weights=_NEED_WEIGHTS,
                attn_mask=None, average_attn_weights=True, is_causal=False):
        """torch.nn.MultiheadAttention.forward's signature (torch 2.x) -> (output, None).

        favor never forms the L x S attention weights, so the second output is None. Left at
        its default, need_weights asks for nothing a caller reads here and is ignored; passing
        need_weights=True explicitly is refused (pass need_weights=False). is_causal=True (or
        the module's causal=True) makes attention causal, with attn_mask the causal mask or
        None: favor does not read an L x S mask; any other attn_mask is refused.
        """
        if need_weights is not _NEED_WEIGHTS and need_weights:
            raise _core.Error("need_weights: True asks for the L x S attention weights, which "
                              "favor never forms; call with need_weights=False (the default "
                              "of nn.Transformer* layers) to get (output, None)")
        for t, name in ((query, "query"), (key, "key"), (value, "value")):
            T.check_tensor(t, name)
        causal = resolve_causal(attn_mask, is_causal, self.causal)
        unbatched = query.dim() == 2
        same = query is key and key is value
        if not same:
            from ._multihead import _refuse_cross_window
            _refuse_cross_window(self.core)
        if unbatched:
            query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif query.dim() == 3 and not self.batch_first:
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        if query.dim() != 3:
            raise _core.Error(f"query: shape {list(query.shape)} must be (L, E), (L, N, E) or, "
                              "with batch_first, (N, L, E)")
        if same:
            key = value = query
        q, k, v = self._in_projection(query, key, value)
        n, lq, e = q.shape
        heads = lambda x: x.view(n, x.shape[1], self.num_heads, self.head_dim).transpose(1, 2)
        q, k, v = heads(q), heads(k), heads(v)
        self._prepare(k, key_padding_mask)
        y = self.attend(q, k, v, key_padding_mask, causal)
        self._learn(k, key_padding_mask)
        out = self.out_proj(y.transpose(1, 2).reshape(n, lq, e))
        if unbatched:
            out = out.squeeze(0)
        elif not self.batch_first:
            out = out.transpose(0, 1)
        return out, None

    def extra_repr(self):
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"batch_first={self.batch_first}, causal={self.causal}")
