"""favor::sequence_parallel_attention and favor::sequence_parallel_attention_backward: this
rank's slice of FAVOR attention (every kernel and learned map, decay) over a sequence split
into contiguous slices, one per rank (rank order = sequence order).

The arguments are favor::attention's (ops/attention/op.py; the same tensors and plain
values, built by the same code) and the handle of the exchange. Only per-head states cross
between ranks (favor._core.sequence_parallel_attention_map(_backward)). What a rank does
before its C++ call runs inside favor.distributed's agreed(): an error there reaches the
other ranks, who are in the call, and every rank raises the same favor.Error.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from ... import _core
from ...distributed._agreement import agreed
from .. import _dispatch
from .. import _tensors as T
from ..attention.layout import backward_fake, decay_list, feature_map
from ..attention.op import backward_outputs, input_grads
from .exchanges import exchange_of, record


def _prepare(tensors, key_padding_mask, w, weights, bias, lam, decay, fit_a, fit_basis, kernel,
             scale):
    """(numpy views of tensors, the FeatureMap, the key mask, the decay list)."""
    T.follow_torch_threads()
    return ([T.view(t) for t in tensors],
            feature_map(w, weights, bias, lam, fit_a, fit_basis, kernel, scale),
            T.keep_mask(key_padding_mask), decay_list(decay))


@torch.library.custom_op("favor::sequence_parallel_attention", mutates_args=(),
                         device_types="cpu")
def sequence_parallel_attention_op(q: Tensor, k: Tensor, v: Tensor, w: Tensor,
                                   weights: Optional[Tensor], bias: Optional[Tensor],
                                   lam: Optional[Tensor], decay: Optional[Tensor],
                                   key_padding_mask: Optional[Tensor], fit_a: Optional[Tensor],
                                   fit_basis: Optional[Tensor], kernel: str, causal: bool,
                                   scale: Optional[float], exchange: int) -> Tensor:
    """y [.., Nq_r, Dv] float32: this rank's output slice (collective over the exchange)."""
    ex = exchange_of(exchange)
    (qn, kn, vn), fm, keep, gammas = agreed(ex, lambda: _prepare(
        (q, k, v), key_padding_mask, w, weights, bias, lam, decay, fit_a, fit_basis, kernel,
        scale))
    y, stats = _core.sequence_parallel_attention_map(qn, kn, vn, fm, ex, causal=causal,
                                                     key_mask=keep, decay=gammas)
    record(ex, "forward_stats", stats)
    return T.tensor(y)


@sequence_parallel_attention_op.register_fake
def _(q, k, v, w, weights, bias, lam, decay, key_padding_mask, fit_a, fit_basis, kernel, causal,
      scale, exchange):
    return q.new_empty((*q.shape[:-1], v.shape[-1]), dtype=torch.float32)


@torch.library.custom_op("favor::sequence_parallel_attention_backward", mutates_args=(),
                         device_types="cpu")
def sequence_parallel_attention_backward_op(
        dy: Tensor, q: Tensor, k: Tensor, v: Tensor, w: Tensor, weights: Optional[Tensor],
        bias: Optional[Tensor], lam: Optional[Tensor], decay: Optional[Tensor],
        key_padding_mask: Optional[Tensor], fit_a: Optional[Tensor], fit_basis: Optional[Tensor],
        kernel: str, causal: bool, scale: Optional[float], exchange: int, parameter_grads: bool
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dw, dbias, dlambda, ddecay) as favor::attention_backward's; the parameter
    gradients are this rank's share (their sum over ranks is the whole sequence's)."""
    ex = exchange_of(exchange)
    (qn, kn, vn, dyn), fm, keep, gammas = agreed(ex, lambda: _prepare(
        (q, k, v, dy.to(torch.float32)), key_padding_mask, w, weights, bias, lam, decay, fit_a,
        fit_basis, kernel, scale))
    *out, stats = _core.sequence_parallel_attention_map_backward(
        qn, kn, vn, dyn, fm, ex, causal=causal, key_mask=keep, decay=gammas,
        parameter_grads=parameter_grads)
    record(ex, "backward_stats", stats)
    return backward_outputs(out, weights, bias, lam, decay)


@sequence_parallel_attention_backward_op.register_fake
def _(dy, q, k, v, w, weights, bias, lam, decay, key_padding_mask, fit_a, fit_basis, kernel,
      causal, scale, exchange, parameter_grads):
    return backward_fake(q, k, v, w, weights, bias, lam, decay, parameter_grads)


def _setup_context(ctx, inputs, output):
    *tensors, kernel, causal, scale, exchange = inputs
    ctx.save_for_backward(*tensors)
    ctx.options = (kernel, causal, scale, exchange)
    ctx.exchange = exchange_of(exchange)  # alive until the backward


def _backward(ctx, dy):
    # saved_tensors raises on this rank alone for a tensor modified in place: agreed
    saved = agreed(ctx.exchange, lambda: ctx.saved_tensors)
    need = ctx.needs_input_grad
    grads = sequence_parallel_attention_backward_op(dy, *saved, *ctx.options, any(need[3:8]))
    return (*input_grads(need, *grads, saved[4]), None, None, None, None, None, None, None)


sequence_parallel_attention_op.register_autograd(_backward, setup_context=_setup_context)


# Other devices: the exchange runs on the host (MPI or the given transport), so do the kernels
for _op, _name in ((sequence_parallel_attention_op, "sequence_parallel_attention"),
                   (sequence_parallel_attention_backward_op, "sequence_parallel_attention_backward")):
    _op.register_kernel(_dispatch.OTHER_DEVICES, _dispatch.on_host(_op, _name))
