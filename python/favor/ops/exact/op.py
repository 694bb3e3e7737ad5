"""favor::exact_attention and favor::exact_attention_backward: softmax(scale q k^T) v on CPU
tensors by the C++ library (causal, key mask), with its backward."""
from typing import Optional, Tuple

import torch
from torch import Tensor

from ... import _args, _core
from .. import _tensors as T


@torch.library.custom_op("favor::exact_attention", mutates_args=(), device_types="cpu")
def exact_attention_op(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Optional[Tensor],
                       causal: bool, scale: Optional[float]) -> Tensor:
    T.follow_torch_threads()
    return T.tensor(_core.exact_attention(T.view(q), T.view(k), T.view(v), causal=causal,
                                          scale=scale, key_mask=T.keep_mask(key_padding_mask)))


@exact_attention_op.register_fake
def _(q, k, v, key_padding_mask, causal, scale):
    return q.new_empty((*q.shape[:-1], v.shape[-1]), dtype=torch.float32)


@torch.library.custom_op("favor::exact_attention_backward", mutates_args=(), device_types="cpu")
def exact_attention_backward_op(dy: Tensor, q: Tensor, k: Tensor, v: Tensor,
                                key_padding_mask: Optional[Tensor], causal: bool,
                                scale: Optional[float]) -> Tuple[Tensor, Tensor, Tensor]:
    T.follow_torch_threads()
    dq, dk, dv, _ = _core.exact_attention_backward(
        T.view(q), T.view(k), T.view(v), T.view(dy), causal=causal, scale=scale,
        key_mask=T.keep_mask(key_padding_mask))
    return T.tensor(dq), T.tensor(dk), T.tensor(dv)


@exact_attention_backward_op.register_fake
def _(dy, q, k, v, key_padding_mask, causal, scale):
    return (q.new_empty(q.shape, dtype=torch.float32), k.new_empty(k.shape, dtype=torch.float32),
            v.new_empty(v.shape, dtype=torch.float32))


def _setup_context(ctx, inputs, output):
    q, k, v, key_padding_mask, causal, scale = inputs
    ctx.save_for_backward(q, k, v, key_padding_mask)
    ctx.options = (causal, scale)


def _backward(ctx, dy):
    q, k, v, key_padding_mask = ctx.saved_tensors
    dq, dk, dv = exact_attention_backward_op(dy.to(torch.float32), q, k, v, key_padding_mask,
                                             *ctx.options)
    need = ctx.needs_input_grad
    return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None, None,
            None, None)


exact_attention_op.register_autograd(_backward, setup_context=_setup_context)


def exact_attention(q, k, v, key_padding_mask, causal, scale):
    """The op on float32 tensors (favor.torch.attention(method='exact') checks and casts)."""
    return exact_attention_op(q, k, v, key_padding_mask, bool(causal),
                              _args.optional_number(scale, "scale"))
