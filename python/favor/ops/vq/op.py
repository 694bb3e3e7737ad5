"""favor::vq_attention and favor::vq_attention_backward: q [.., Nq, D], k [.., Nk, D],
v [.., Nk, Dv], codebook [c, D] or [H or 1, c, D]. Kernels: CPU the C++ library; every other
device (VQ has no fused Triton kernel) plain torch operations (generic.py), the default."""
from typing import Optional, Tuple

import torch
from torch import Tensor

from ... import _args, _core
from ..._args import block_length
from .. import _dispatch
from .. import _tensors as T
from . import generic


def _options(key_padding_mask, causal, scale, tau, block):
    return dict(causal=causal, scale=scale, key_mask=T.keep_mask(key_padding_mask), tau=tau,
                block=block)


def _generic(q, k, v, codebook, key_padding_mask, causal, scale, tau, block):
    return generic.vq_attention(q.float(), k.float(), v.float(), codebook.float(),
                                key_padding_mask, causal, scale, tau, block)


@torch.library.custom_op("favor::vq_attention", mutates_args=(), device_types=None)
def vq_attention_op(q: Tensor, k: Tensor, v: Tensor, codebook: Tensor,
                    key_padding_mask: Optional[Tensor], causal: bool, scale: Optional[float],
                    tau: float, block: int) -> Tensor:
    return _generic(q, k, v, codebook, key_padding_mask, causal, scale, tau, block)


@vq_attention_op.register_kernel("cpu")
def cpu_forward(q, k, v, codebook, key_padding_mask, causal, scale, tau, block):
    T.follow_torch_threads()
    y, _ = _core.vq_attention(T.view(q), T.view(k), T.view(v), T.view(codebook),
                              **_options(key_padding_mask, causal, scale, tau, block))
    return T.tensor(y)


@vq_attention_op.register_fake
def _(q, k, v, codebook, key_padding_mask, causal, scale, tau, block):
    return q.new_empty((*q.shape[:-1], v.shape[-1]), dtype=torch.float32)


@torch.library.custom_op("favor::vq_attention_backward", mutates_args=(), device_types=None)
def vq_attention_backward_op(dy: Tensor, q: Tensor, k: Tensor, v: Tensor, codebook: Tensor,
                             key_padding_mask: Optional[Tensor], causal: bool,
                             scale: Optional[float], tau: float, block: int,
                             codebook_grad: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dcodebook); dcodebook is empty unless codebook_grad. The default:
    autograd through the torch forward, recomputed."""
    return _generic_backward(dy, q, k, v, codebook, key_padding_mask, causal, scale, tau, block,
                             codebook_grad)


def _generic_backward(dy, q, k, v, codebook, key_padding_mask, causal, scale, tau, block,
                      codebook_grad):
    leaves = [t.detach().float().requires_grad_(True) for t in (q, k, v)]
    cb = codebook.detach().float().requires_grad_(codebook_grad)
    with torch.enable_grad():
        y = _generic(*leaves, cb, key_padding_mask, causal, scale, tau, block)
        wanted = leaves + ([cb] if codebook_grad else [])
        got = [g.detach() for g in torch.autograd.grad(y, wanted, dy.to(y.dtype))]
    return (*got[:3], got[3] if codebook_grad else T.empty().to(q.device))


@vq_attention_backward_op.register_kernel("cpu")
def cpu_backward(dy, q, k, v, codebook, key_padding_mask, causal, scale, tau, block,
                 codebook_grad):
    T.follow_torch_threads()
    dq, dk, dv, dc = _core.vq_attention_backward(
        T.view(q), T.view(k), T.view(v), T.view(dy), T.view(codebook),
        codebook_grad=codebook_grad, **_options(key_padding_mask, causal, scale, tau, block))
    return (T.tensor(dq), T.tensor(dk), T.tensor(dv),
            T.tensor(dc) if codebook_grad else T.empty())


@vq_attention_backward_op.register_fake
def _(dy, q, k, v, codebook, key_padding_mask, causal, scale, tau, block, codebook_grad):
    like = lambda t, shape: t.new_empty(shape, dtype=torch.float32)
    return (like(q, q.shape), like(k, k.shape), like(v, v.shape),
            like(codebook, codebook.shape if codebook_grad else 0))


class Formula:
    """favor::vq_attention's autograd formula (every kernel's)."""

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, codebook, key_padding_mask, causal, scale, tau, block = inputs
        ctx.save_for_backward(q, k, v, codebook, key_padding_mask)
        ctx.options = (causal, scale, tau, block)

    @staticmethod
    def backward(ctx, dy, backward_op=None, need=None):
        q, k, v, codebook, key_padding_mask = ctx.saved_tensors
        need = ctx.needs_input_grad if need is None else need
        run = vq_attention_backward_op if backward_op is None else backward_op
        dq, dk, dv, dc = run(dy.to(torch.float32), q, k, v, codebook, key_padding_mask,
                             *ctx.options, bool(need[3]))
        return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None,
                dc if need[3] else None, None, None, None, None, None)


vq_attention_op.register_autograd(Formula.backward, setup_context=Formula.setup_context)
_dispatch.register("vq_attention", {"cpu": (cpu_forward, cpu_backward),
                                    "torch": (_generic, _generic_backward)})


def check_codebook(codebook):
    T.check_tensor(codebook, "codebook")
    if codebook.dim() not in (2, 3):
        raise _core.Error(f"codebook: shape {list(codebook.shape)} must be [c, D] or "
                          "[H or 1, c, D]")


@T.names_key_padding_mask
def vq_attention(q, k, v, codebook, *, causal=False, scale=None, key_padding_mask=None,
                 tau=0.0, block=None, backend=None):
    """Differentiable Transformer-VQ attention on torch tensors (favor.vq_attention), through
    the op favor::vq_attention.

    q [B, H, Nq, D], k [B, H, Nk, D], v [B, H, Nk, Dv] (or [N, D]) -> [B, H, Nq, Dv] in the
    dtype of q (float64/float16/bfloat16 are computed in float32: a cast copy); codebook
    [c, D] or [H or 1, c, D]. tau = 0: hard VQ, tau > 0: soft VQ. key_padding_mask [B, Nk]:
    torch's convention, True (or -inf) = ignore the key. Gradients (favor's backward): dq and
    dv exact; dk straight-through for hard VQ (the gradient of the quantised key) and exact
    for soft VQ; the codebook receives dL/dC when it requires grad (learning the codebook by
    gradient instead of EMA). The backward uses the codebook's values at the time of the
    forward only if they are not changed in between: pass a clone of a codebook you update in
    place (VQCore does). backend: as favor.torch.attention's ('cpu', 'torch' or None; VQ has
    no Triton kernel: CUDA tensors take the default kernel, plain torch, ops/vq/generic.py).
    """
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        T.check_tensor(t, name)
    check_codebook(codebook)
    out_dtype = q.dtype
    forced = _dispatch.forced("vq_attention", backend, q)
    T.check_same_device(q, ((k, "k"), (v, "v")))
    codebook = codebook.to(q.device)  # the codebook and the mask follow q's device
    if key_padding_mask is not None:
        key_padding_mask = key_padding_mask.to(q.device)
    args = (T.as_float32(q, "q"), T.as_float32(k, "k"), T.as_float32(v, "v"),
            T.as_float32(codebook, "codebook"), T.check_mask(key_padding_mask), bool(causal),
            _args.optional_number(scale, "scale"), _args.number(tau, "tau"), block_length(block))
    if forced is None:
        y = vq_attention_op(*args)
    else:
        y = _dispatch.ForcedAutograd.apply(Formula, *forced, *args)
    return y if out_dtype == torch.float32 else y.to(out_dtype)
    y = vq_attention_op(T.as_float32(q, "q"), T.as_float32(k, "k"), T.as_float32(v, "v"),
                        T.as_float32(codebook, "codebook"), T.check_mask(key_padding_mask),
                        bool(causal), _args.optional_number(scale, "scale"),
                        _args.number(tau, "tau"), block_length(block))
    return y if out_dtype == torch.float32 else y.to(out_dtype)
