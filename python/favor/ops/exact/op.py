"""favor::exact_attention and favor::exact_attention_backward: softmax(scale q k^T) v (causal,
key mask) with its backward; with window or sinks, softmax over each query's window and
sinks alone (C++ ExactOptions::window, ::sinks; favor.torch.attention(method='window')).
Kernels: CPU the C++ library; every other device (CUDA included: SDPA's flash,
memory-efficient and cuDNN kernels are the fused ones there) plain torch operations
(generic.py; the window: the hybrid's torch band, attention/hybrid.py), the default."""
from typing import Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from ... import _args, _core
from .. import _dispatch
from .. import _tensors as T
from ..attention import paths
from . import generic


def _generic(q, k, v, key_padding_mask, causal, scale, window=0, sinks=0):
    """y by the torch path, after the rules the C++ call checks (shapes, finite values, the
    scale's, window's and sinks' rules checked by C++ on one zero token)."""
    paths.check_inputs(q, k, v, causal, key_padding_mask, window, sinks)
    one = np.zeros((1, 1, 1, 1), np.float32)
    _core.exact_attention(one, one, one, scale=scale, window=window, sinks=sinks)
    if window or sinks:
        from ..attention.hybrid import window_attention
        s = q.shape[-1] ** -0.5 if scale is None else float(scale)
        y = window_attention(paths.flat(q.float()), paths.flat(k.float()), paths.flat(v.float()),
                             paths.keep_rows(key_padding_mask, q), causal, window, sinks, s)
        return y.reshape(*q.shape[:-1], v.shape[-1])
    keep = paths.keep_batch(key_padding_mask, q.device)
    return generic.exact_attention(q.float(), k.float(), v.float(), keep, causal, scale)


@torch.library.custom_op("favor::exact_attention", mutates_args=(), device_types=None)
def exact_attention_op(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Optional[Tensor],
                       causal: bool, scale: Optional[float], window: int = 0,
                       sinks: int = 0) -> Tensor:
    return _generic(q, k, v, key_padding_mask, causal, scale, window, sinks)


@exact_attention_op.register_kernel("cpu")
def cpu_forward(q, k, v, key_padding_mask, causal, scale, window=0, sinks=0):
    T.follow_torch_threads()
    return T.tensor(_core.exact_attention(T.view(q), T.view(k), T.view(v), causal=causal,
                                          scale=scale, key_mask=T.keep_mask(key_padding_mask),
                                          window=window, sinks=sinks))


@exact_attention_op.register_fake
def _(q, k, v, key_padding_mask, causal, scale, window=0, sinks=0):
    return q.new_empty((*q.shape[:-1], v.shape[-1]), dtype=torch.float32)


@torch.library.custom_op("favor::exact_attention_backward", mutates_args=(), device_types=None)
def exact_attention_backward_op(dy: Tensor, q: Tensor, k: Tensor, v: Tensor,
                                key_padding_mask: Optional[Tensor], causal: bool,
                                scale: Optional[float], window: int = 0,
                                sinks: int = 0) -> Tuple[Tensor, Tensor, Tensor]:
    return _generic_backward(dy, q, k, v, key_padding_mask, causal, scale, window, sinks)


def _generic_backward(dy, q, k, v, key_padding_mask, causal, scale, window=0, sinks=0):
    """The default backward: autograd through the torch forward, recomputed."""
    leaves = [t.detach().float().requires_grad_(True) for t in (q, k, v)]
    with torch.enable_grad():
        y = _generic(*leaves, key_padding_mask, causal, scale, window, sinks)
        return tuple(g.detach() for g in torch.autograd.grad(y, leaves, dy.to(y.dtype)))


@exact_attention_backward_op.register_kernel("cpu")
def cpu_backward(dy, q, k, v, key_padding_mask, causal, scale, window=0, sinks=0):
    T.follow_torch_threads()
    dq, dk, dv, _ = _core.exact_attention_backward(
        T.view(q), T.view(k), T.view(v), T.view(dy), causal=causal, scale=scale,
        key_mask=T.keep_mask(key_padding_mask), window=window, sinks=sinks)
    return T.tensor(dq), T.tensor(dk), T.tensor(dv)


@exact_attention_backward_op.register_fake
def _(dy, q, k, v, key_padding_mask, causal, scale, window=0, sinks=0):
    return (q.new_empty(q.shape, dtype=torch.float32), k.new_empty(k.shape, dtype=torch.float32),
            v.new_empty(v.shape, dtype=torch.float32))


class Formula:
    """favor::exact_attention's autograd formula (every kernel's)."""

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, key_padding_mask, causal, scale, window, sinks = inputs
        ctx.save_for_backward(q, k, v, key_padding_mask)
        ctx.options = (causal, scale, window, sinks)

    @staticmethod
    def backward(ctx, dy, backward_op=None, need=None):
        q, k, v, key_padding_mask = ctx.saved_tensors
        run = exact_attention_backward_op if backward_op is None else backward_op
        dq, dk, dv = run(dy.to(torch.float32), q, k, v, key_padding_mask, *ctx.options)
        need = ctx.needs_input_grad if need is None else need
        return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None, None,
                None, None, None, None)


exact_attention_op.register_autograd(Formula.backward, setup_context=Formula.setup_context)
_dispatch.register("exact_attention", {"cpu": (cpu_forward, cpu_backward),
                                       "torch": (_generic, _generic_backward)})


def exact_attention(q, k, v, key_padding_mask, causal, scale, backend=None, window=0, sinks=0):
    """The op on float32 tensors (favor.torch.attention(method='exact' or 'window') checks and
    casts); backend as favor.torch.attention's (ops/_dispatch.py)."""
    args = (q, k, v, key_padding_mask, bool(causal), _args.optional_number(scale, "scale"),
            int(window), int(sinks))
    forced = _dispatch.forced("exact_attention", backend, q)
    if forced is None:
        return exact_attention_op(*args)
    return _dispatch.ForcedAutograd.apply(Formula, *forced, *args)
