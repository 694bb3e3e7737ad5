"""favor.torch.attention: FAVOR (or exact) attention as a torch.autograd.Function."""
import functools

import torch
from torch.autograd.function import once_differentiable

from .. import _core
from ..api import _fit, make_projection
from . import _tensors as T


class _Spec:
    """What the autograd function needs besides tensors."""
    __slots__ = ("projection", "kernel", "causal", "scale", "keep", "fit")

    def __init__(self, projection, kernel, causal, scale, keep, fit):
        self.projection, self.kernel, self.causal = projection, kernel, causal
        self.scale, self.keep, self.fit = scale, keep, fit

    def options(self):
        return dict(kernel=self.kernel, causal=self.causal, scale=self.scale,
                    key_mask=self.keep, fit=self.fit)


class _FavorFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, w, spec):
        proj = spec.projection if w is None else T.projection_matrix(w, q.shape[-1])
        want_context = not spec.causal and any(ctx.needs_input_grad[:4])
        y, _, saved = _core.attention(T.view(q), T.view(k), T.view(v), proj,
                                      save_context=want_context, **spec.options())
        ctx.save_for_backward(q, k, v)
        ctx.spec, ctx.proj, ctx.saved = spec, proj, saved
        return T.tensor(y)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        q, k, v = ctx.saved_tensors
        want_dw = ctx.needs_input_grad[3]
        dq, dk, dv, dw = _core.attention_backward(
            T.view(q), T.view(k), T.view(v), T.view(dy.to(torch.float32)), ctx.proj,
            projection_grad=want_dw, context=ctx.saved, **ctx.spec.options())
        need = ctx.needs_input_grad
        return (T.tensor(dq) if need[0] else None, T.tensor(dk) if need[1] else None,
                T.tensor(dv) if need[2] else None, T.tensor(dw) if want_dw else None, None)


class _ExactFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, spec):
        y = _core.exact_attention(T.view(q), T.view(k), T.view(v), causal=spec.causal,
                                  scale=spec.scale, key_mask=spec.keep)
        ctx.save_for_backward(q, k, v)
        ctx.spec = spec
        return T.tensor(y)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        q, k, v = ctx.saved_tensors
        s = ctx.spec
        dq, dk, dv, _ = _core.exact_attention_backward(
            T.view(q), T.view(k), T.view(v), T.view(dy.to(torch.float32)), causal=s.causal,
            scale=s.scale, key_mask=s.keep)
        return T.tensor(dq), T.tensor(dk), T.tensor(dv), None


@functools.lru_cache(maxsize=64)
def _drawn(kind, m, d, norms, seed):
    return make_projection(d, kind, features=m, norms=norms, seed=seed)


def resolve_projection(projection, d, features, norms, seed):
    """(favor.Projection or None, float32 tensor W or None) for a kind, a Projection or an
    [m, d] tensor (a tensor takes part in autograd: its gradient is dL/dW)."""
    if isinstance(projection, torch.Tensor):
        if features is not None and features != projection.shape[0]:
            raise _core.Error(f"features: {features} differs from the projection tensor's "
                              f"m = {projection.shape[0]}")
        return None, T.as_float32(projection, "projection")
    if isinstance(projection, str):
        m = 256 if features is None else features
        return _drawn(projection, m, d, norms, seed), None
    return make_projection(d, projection, features=features, norms=norms, seed=seed), None


def attention(q, k, v, *, causal=False, kernel="positive", projection="orthogonal",
              features=None, norms="chi", seed=0, scale=None, key_padding_mask=None, fit=None,
              method="favor"):
    """Differentiable FAVOR attention on CPU tensors (exact attention with method='exact').

    q [B, H, Nq, D], k [B, H, Nk, D], v [B, H, Nk, Dv] (or [N, D]) -> [B, H, Nq, Dv], in the
    dtype of q. float32 tensors are read in place (any strides); float64/float16/bfloat16
    are computed in float32. projection: a kind (drawn with `features` rows, `norms`,
    `seed`), a favor.Projection, or a float [m, D] tensor, which receives a gradient when it
    requires one (every kernel; FAVOR++/FAVOR# hold their fit fixed). key_padding_mask
    [B, Nk]: torch's convention, True (or -inf) = ignore the key. kernel, scale and fit as in favor.attention.
    The forward pass saves the key state for the backward (bidirectional); double backward
    is not supported.
    """
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        T.check_tensor(t, name)
    T.follow_torch_threads()
    out_dtype = q.dtype
    q32, k32, v32 = T.as_float32(q, "q"), T.as_float32(k, "k"), T.as_float32(v, "v")
    keep = T.keep_mask(key_padding_mask)
    if method == "exact":
        y = _ExactFunction.apply(q32, k32, v32, _Spec(None, None, causal, scale, keep, None))
    elif method == "favor":
        d = q.shape[-1]
        proj, w = resolve_projection(projection, d, features, norms, seed)
        spec = _Spec(proj, kernel, causal, scale, keep, _fit(fit, kernel, d))
        y = _FavorFunction.apply(q32, k32, v32, w, spec)
    else:
        raise _core.Error(f"method: '{method}' is not a method; use favor or exact")
    return y if out_dtype == torch.float32 else y.to(out_dtype)
