"""favor::exact_attention and favor::exact_attention_backward: softmax(scale q k^T) v (causal,
key mask) with its backward; with window or sinks, softmax over each query's window and
sinks alone (C++ ExactOptions::window, ::sinks; favor.torch.attention(method='window')).
Kernels: CPU the C++ library; every other device (CUDA included: SDPA's flash,
memory-efficient and cuDNN kernels are the fused ones there) plain torch operations
(generic.py; the window: the hybrid's torch band, ops/hybrid/chunk.py), the default."""
from typing import Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from ... import _args, _core
from .. import _dispatch
from .. import _tensors as T
from ..attention import paths
from ..attention.op import _signed, _unsigned
from . import generic


def _generic(q, k, v, key_padding_mask, causal, scale, window=0, sinks=0):
    """y by the torch path, after the rules the C++ call checks (shapes, finite values, the
    scale's, window's and sinks' rules checked by C++ on one zero token)."""
    paths.check_inputs(q, k, v, causal, key_padding_mask, window, sinks)
    one = np.zeros((1, 1, 1, 1), np.float32)
    _core.exact_attention(one, one, one, scale=scale, window=window, sinks=sinks)
    if window or sinks:
        from ..hybrid.chunk import window_attention
        s = q.shape[-1] ** -0.5 if scale is None else float(scale)
        y = window_attention(paths.flat(q.float()), paths.flat(k.float()), paths.flat(v.float()),
                             paths.keep_rows(key_padding_mask, q), causal, window, sinks, s)
        return y.reshape(*q.shape[:-1], v.shape[-1])
    keep = paths.keep_batch(key_padding_mask, q.device)
    return generic.exact_attention(q.float(), k.float(), v.float(), keep, causal, scale)


def _saves(save_context, window, sinks):
    """Whether the call saves a context: a windowed call asked to (ExactContext)."""
    return bool(save_context) and bool(window or sinks)


def _lse_shape(q, save_context, window, sinks):
    """The saved lse's shape: q's rows [.., Nq] when the call saves, else empty."""
    return q.shape[:-1] if _saves(save_context, window, sinks) else (0,)


def _nothing_saved(q, save_context, window, sinks):
    """The saved outputs of a kernel that saves nothing (the backward recomputes): lse of the
    size a saving call has (zeros), fingerprint [0 (not valid), 0]."""
    lse = q.new_zeros(_lse_shape(q, save_context, window, sinks), dtype=torch.float64)
    return lse, q.new_zeros(2, dtype=torch.int64)


@torch.library.custom_op("favor::exact_attention", mutates_args=(), device_types=None)
def exact_attention_op(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Optional[Tensor],
                       causal: bool, scale: Optional[float], window: int = 0,
                       sinks: int = 0, save_context: bool = False
                       ) -> Tuple[Tensor, Tensor, Tensor]:
    """(y [.., Nq, Dv] float32, lse, fingerprint). With save_context, a windowed call (window
    or sinks) on the CPU kernel saves its softmax log normalisers lse [.., Nq] float64 and
    [1, the fingerprint] (C++ ExactContext) for the backward, which then skips rerunning the
    band's forward; other kernels return zeros there and [0, 0] (the backward recomputes).
    Without save_context or a window, lse is empty."""
    return _default(q, k, v, key_padding_mask, causal, scale, window, sinks, save_context)


def _default(q, k, v, key_padding_mask, causal, scale, window=0, sinks=0, save_context=False):
    """The default kernel's outputs: y by the torch path, nothing saved."""
    y = _generic(q, k, v, key_padding_mask, causal, scale, window, sinks)
    return (y, *_nothing_saved(q, save_context, window, sinks))


@exact_attention_op.register_kernel("cpu")
def cpu_forward(q, k, v, key_padding_mask, causal, scale, window=0, sinks=0, save_context=False):
    T.follow_torch_threads()
    saves = _saves(save_context, window, sinks)
    out = _core.exact_attention(T.view(q), T.view(k), T.view(v), causal=causal, scale=scale,
                                key_mask=T.keep_mask(key_padding_mask), window=window,
                                sinks=sinks, save_context=saves)
    if not saves:
        return (T.tensor(out), *_nothing_saved(q, save_context, window, sinks))
    y, context = out
    return (T.tensor(y), T.tensor(context.lse).reshape(q.shape[:-1]),
            torch.tensor([1, _signed(context.fingerprint)], dtype=torch.int64))


@exact_attention_op.register_fake
def _(q, k, v, key_padding_mask, causal, scale, window=0, sinks=0, save_context=False):
    y = q.new_empty((*q.shape[:-1], v.shape[-1]), dtype=torch.float32)
    lse = q.new_empty(_lse_shape(q, save_context, window, sinks), dtype=torch.float64)
    return y, lse, q.new_empty(2, dtype=torch.int64)


@torch.library.custom_op("favor::exact_attention_backward", mutates_args=(), device_types=None)
def exact_attention_backward_op(dy: Tensor, q: Tensor, k: Tensor, v: Tensor,
                                key_padding_mask: Optional[Tensor], causal: bool,
                                scale: Optional[float], window: int = 0, sinks: int = 0,
                                y: Optional[Tensor] = None, lse: Optional[Tensor] = None,
                                fingerprint: Optional[Tensor] = None
                                ) -> Tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv); y, lse, fingerprint: what the forward saved (the CPU kernel reads them
    when fingerprint[0] is 1; every other case recomputes the forward)."""
    return _generic_backward(dy, q, k, v, key_padding_mask, causal, scale, window, sinks)


def _generic_backward(dy, q, k, v, key_padding_mask, causal, scale, window=0, sinks=0, y=None,
                      lse=None, fingerprint=None):
    """The default backward: autograd through the torch forward, recomputed."""
    leaves = [t.detach().float().requires_grad_(True) for t in (q, k, v)]
    with torch.enable_grad():
        y = _generic(*leaves, key_padding_mask, causal, scale, window, sinks)
        return tuple(g.detach() for g in torch.autograd.grad(y, leaves, dy.to(y.dtype)))


@exact_attention_backward_op.register_kernel("cpu")
def cpu_backward(dy, q, k, v, key_padding_mask, causal, scale, window=0, sinks=0, y=None,
                 lse=None, fingerprint=None):
    T.follow_torch_threads()
    saved = {}
    if fingerprint is not None and int(fingerprint[0]) == 1:
        saved = dict(y=T.view(y), context=_core.ExactContext.from_arrays(
            T.array(lse.reshape(-1)), _unsigned(int(fingerprint[1]))))
    dq, dk, dv, _ = _core.exact_attention_backward(
        T.view(q), T.view(k), T.view(v), T.view(dy), causal=causal, scale=scale,
        key_mask=T.keep_mask(key_padding_mask), window=window, sinks=sinks, **saved)
    return T.tensor(dq), T.tensor(dk), T.tensor(dv)


@exact_attention_backward_op.register_fake
def _(dy, q, k, v, key_padding_mask, causal, scale, window=0, sinks=0, y=None, lse=None,
      fingerprint=None):
    return (q.new_empty(q.shape, dtype=torch.float32), k.new_empty(k.shape, dtype=torch.float32),
            v.new_empty(v.shape, dtype=torch.float32))


class Formula:
    """favor::exact_attention's autograd formula (every kernel's)."""

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, key_padding_mask, causal, scale, window, sinks, save_context = inputs
        y, lse, fingerprint = output
        ctx.save_for_backward(q, k, v, key_padding_mask, y, lse, fingerprint)
        ctx.options = (causal, scale, window, sinks)

    @staticmethod
    def backward(ctx, dy, *_, backward_op=None, need=None):
        q, k, v, key_padding_mask, y, lse, fingerprint = ctx.saved_tensors
        run = exact_attention_backward_op if backward_op is None else backward_op
        dq, dk, dv = run(dy.to(torch.float32), q, k, v, key_padding_mask, *ctx.options,
                         y.detach(), lse, fingerprint)
        need = ctx.needs_input_grad if need is None else need
        return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None, None,
                None, None, None, None, None)


exact_attention_op.register_autograd(Formula.backward, setup_context=Formula.setup_context)
_dispatch.register("exact_attention", {"cpu": (cpu_forward, cpu_backward),
                                       "torch": (_default, _generic_backward)})


def exact_attention(q, k, v, key_padding_mask, causal, scale, backend=None, window=0, sinks=0):
    """y of the op on float32 tensors (favor.torch.attention(method='exact' or 'window') checks
    and casts); backend as favor.torch.attention's (ops/_dispatch.py). A windowed call under
    autograd saves its context (the backward then skips the band's forward)."""
    save = (bool(window or sinks) and torch.is_grad_enabled()
            and any(t.requires_grad for t in (q, k, v)))
    args = (q, k, v, key_padding_mask, bool(causal), _args.optional_number(scale, "scale"),
            int(window), int(sinks), save)
    forced = _dispatch.forced("exact_attention", backend, q)
    if forced is None:
        return exact_attention_op(*args)[0]
    return _dispatch.ForcedAutograd.apply(Formula, *forced, *args)[0]
