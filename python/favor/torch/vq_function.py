"""favor.torch.vq_attention (a torch.autograd.Function) and VQDecoder: Transformer-VQ with
torch tensors."""
import torch
from torch.autograd.function import once_differentiable

from .. import _core
from ..vq import _block
from . import _tensors as T
from .decoder import _Streaming


class _Spec:
    __slots__ = ("causal", "scale", "keep", "tau", "block")

    def __init__(self, causal, scale, keep, tau, block):
        self.causal, self.scale, self.keep, self.tau, self.block = causal, scale, keep, tau, block

    def options(self):
        return dict(causal=self.causal, scale=self.scale, key_mask=self.keep, tau=self.tau,
                    block=self.block)


class _VQFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, codebook, spec):
        y, _ = _core.vq_attention(T.view(q), T.view(k), T.view(v), T.view(codebook),
                                  **spec.options())
        ctx.save_for_backward(q, k, v, codebook)
        ctx.spec = spec
        return T.tensor(y)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        q, k, v, codebook = ctx.saved_tensors
        need = ctx.needs_input_grad
        dq, dk, dv, dc = _core.vq_attention_backward(
            T.view(q), T.view(k), T.view(v), T.view(dy.to(torch.float32)), T.view(codebook),
            codebook_grad=need[3], **ctx.spec.options())
        return (T.tensor(dq) if need[0] else None, T.tensor(dk) if need[1] else None,
                T.tensor(dv) if need[2] else None, T.tensor(dc) if need[3] else None, None)


def check_codebook(codebook):
    T.check_tensor(codebook, "codebook")
    if codebook.dim() not in (2, 3):
        raise _core.Error(f"codebook: shape {list(codebook.shape)} must be [c, D] or "
                          "[H or 1, c, D]")


def vq_attention(q, k, v, codebook, *, causal=False, scale=None, key_padding_mask=None,
                 tau=0.0, block=None):
    """Differentiable Transformer-VQ attention on CPU tensors (favor.vq_attention).

    q [B, H, Nq, D], k [B, H, Nk, D], v [B, H, Nk, Dv] (or [N, D]) -> [B, H, Nq, Dv] in the
    dtype of q; codebook [c, D] or [H or 1, c, D]. tau = 0: hard VQ, tau > 0: soft VQ.
    key_padding_mask [B, Nk]: torch's convention, True (or -inf) = ignore the key.
    Gradients (favor's backward): dq and dv exact; dk straight-through for hard VQ (the
    gradient of the quantised key) and exact for soft VQ; the codebook receives dL/dC when
    it requires grad (learning the codebook by gradient instead of EMA). The backward uses
    the codebook's values at the time of the forward only if they are not changed in
    between: pass a clone of a codebook you update in place (VQAttention does).
    """
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        T.check_tensor(t, name)
    check_codebook(codebook)
    T.follow_torch_threads()
    out_dtype = q.dtype
    spec = _Spec(causal, scale, T.keep_mask(key_padding_mask), float(tau), _block(block))
    y = _VQFunction.apply(T.as_float32(q, "q"), T.as_float32(k, "k"), T.as_float32(v, "v"),
                          T.as_float32(codebook, "codebook"), spec)
    return y if out_dtype == torch.float32 else y.to(out_dtype)


class VQDecoder(_Streaming):
    """Streaming Transformer-VQ state per (batch, head), for generation with torch tensors.

    VQDecoder(batch, heads, dv, codebook, *, scale=None, tau=0.0): the codebook tensor
    ([c, D] or [H, c, D]) is copied. append(k [B, H, T, D], v [B, H, T, Dv]); query(q
    [B, H, T, D]) -> [B, H, T, Dv] (float32; no autograd): query after appending tokens
    0..i equals row i of causal vq_attention. state_bytes is fixed whatever the position.
    """

    def __init__(self, batch, heads, dv, codebook, *, scale=None, tau=0.0):
        check_codebook(codebook)
        self._d = _core.VQDecoder(batch, heads, dv,
                                  T.view(T.as_float32(codebook.detach(), "codebook")),
                                  scale=scale, tau=float(tau))

    codes = property(lambda self: self._d.codes)
