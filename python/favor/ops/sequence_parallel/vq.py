"""favor::sequence_parallel_vq_attention and favor::sequence_parallel_vq_attention_backward:
this rank's slice of Transformer-VQ attention over a sequence split into contiguous slices,
one per rank (rank order = sequence order).

The arguments are favor::vq_attention's (ops/vq/op.py) and the handle of the exchange. The
forward moves the per-code key sums, the backward those and the query-side per-code sums
(favor._core.sequence_parallel_vq_attention(_backward)). What a rank does before its C++
call runs inside favor.distributed's agreed() (vq: the VQ calls' message).
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from ... import _core
from ...distributed._agreement import agreed
from .. import _dispatch
from .. import _tensors as T
from .exchanges import exchange_of, record


def _prepare(tensors, key_padding_mask, causal, scale, tau, block):
    """(numpy views of tensors, the C++ call's options)."""
    T.follow_torch_threads()
    return ([T.view(t) for t in tensors],
            dict(causal=causal, scale=scale, key_mask=T.keep_mask(key_padding_mask), tau=tau,
                 block=block))


@torch.library.custom_op("favor::sequence_parallel_vq_attention", mutates_args=(),
                         device_types="cpu")
def sequence_parallel_vq_attention_op(q: Tensor, k: Tensor, v: Tensor, codebook: Tensor,
                                      key_padding_mask: Optional[Tensor], causal: bool,
                                      scale: Optional[float], tau: float, block: int,
                                      exchange: int) -> Tensor:
    """y [.., Nq_r, Dv] float32: this rank's output slice (collective over the exchange)."""
    ex = exchange_of(exchange)
    views, options = agreed(ex, lambda: _prepare((q, k, v, codebook), key_padding_mask, causal,
                                                 scale, tau, block), vq=True)
    y, stats = _core.sequence_parallel_vq_attention(*views, ex, **options)
    record(ex, "forward_stats", stats)
    return T.tensor(y)


@sequence_parallel_vq_attention_op.register_fake
def _(q, k, v, codebook, key_padding_mask, causal, scale, tau, block, exchange):
    return q.new_empty((*q.shape[:-1], v.shape[-1]), dtype=torch.float32)


@torch.library.custom_op("favor::sequence_parallel_vq_attention_backward", mutates_args=(),
                         device_types="cpu")
def sequence_parallel_vq_attention_backward_op(
        dy: Tensor, q: Tensor, k: Tensor, v: Tensor, codebook: Tensor,
        key_padding_mask: Optional[Tensor], causal: bool, scale: Optional[float], tau: float,
        block: int, exchange: int, codebook_grad: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dcodebook) as favor::vq_attention_backward's; dcodebook (empty unless
    codebook_grad) is this rank's share (its sum over ranks is the whole sequence's)."""
    ex = exchange_of(exchange)
    (qn, kn, vn, dyn, cn), options = agreed(ex, lambda: _prepare(
        (q, k, v, dy.to(torch.float32), codebook), key_padding_mask, causal, scale, tau, block),
        vq=True)
    dq, dk, dv, dc, stats = _core.sequence_parallel_vq_attention_backward(
        qn, kn, vn, dyn, cn, ex, codebook_grad=codebook_grad, **options)
    record(ex, "backward_stats", stats)
    return (T.tensor(dq), T.tensor(dk), T.tensor(dv),
            T.tensor(dc) if codebook_grad else T.empty())


@sequence_parallel_vq_attention_backward_op.register_fake
def _(dy, q, k, v, codebook, key_padding_mask, causal, scale, tau, block, exchange,
      codebook_grad):
    like = lambda t, shape: t.new_empty(shape, dtype=torch.float32)
    return (like(q, q.shape), like(k, k.shape), like(v, v.shape),
            like(codebook, codebook.shape if codebook_grad else 0))


def _setup_context(ctx, inputs, output):
    *tensors, causal, scale, tau, block, exchange = inputs
    ctx.save_for_backward(*tensors)
    ctx.options = (causal, scale, tau, block, exchange)
    ctx.exchange = exchange_of(exchange)  # alive until the backward


def _backward(ctx, dy):
    # saved_tensors raises on this rank alone for a tensor modified in place: agreed
    saved = agreed(ctx.exchange, lambda: ctx.saved_tensors, vq=True)
    need = ctx.needs_input_grad
    dq, dk, dv, dc = sequence_parallel_vq_attention_backward_op(dy, *saved, *ctx.options,
                                                                bool(need[3]))
    return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None,
            dc if need[3] else None, None, None, None, None, None, None)


sequence_parallel_vq_attention_op.register_autograd(_backward, setup_context=_setup_context)


# Other devices: the exchange runs on the host (MPI or the given transport), so do the kernels
for _op, _name in ((sequence_parallel_vq_attention_op, "sequence_parallel_vq_attention"),
                   (sequence_parallel_vq_attention_backward_op, "sequence_parallel_vq_attention_backward")):
    _op.register_kernel(_dispatch.OTHER_DEVICES, _dispatch.on_host(_op, _name))
