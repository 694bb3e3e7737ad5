"""favor.torch.attention: FAVOR (or exact) attention as a torch.autograd.Function."""
import functools

import numpy as np
import torch
from torch.autograd.function import once_differentiable

from .. import _core
from ..api import _batch_heads, _check_map_defaults, _decay, _fit, make_projection
from ..feature_map import FeatureMap, _check_set_count, _check_values
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


class _MapSpec:
    """What the feature-map function needs besides tensors: the base projection (a
    favor.Projection; its rows set m), kernel, scale, fit, causal, key mask, and the decay
    when it is a constant (a decay tensor is an input of the function)."""
    __slots__ = ("projection", "kernel", "scale", "fit", "causal", "keep", "decay")

    def __init__(self, projection, kernel, scale, fit, causal, keep, decay):
        self.projection, self.kernel, self.scale, self.fit = projection, kernel, scale, fit
        self.causal, self.keep, self.decay = causal, keep, decay

    def core_map(self, w, b, lam):
        """The favor._core.FeatureMap of the current parameter values (float32 copies): w
        [m, D] replaces the projection, w [sets, m, D] are per-head weights."""
        arr = lambda t: None if t is None else np.ascontiguousarray(T.view(t.to(torch.float32)))
        proj = self.projection
        if w is not None and w.dim() == 2:
            proj = _core.Projection.from_matrix(arr(w))
        weights = arr(w) if w is not None and w.dim() == 3 else None
        sets = [t.shape[0] for t in (weights, b, lam) if t is not None]
        return _core.FeatureMap(proj, kernel=self.kernel, scale=self.scale, fit=self.fit,
                                heads=sets[0] if sets else 1, weights=weights, bias=arr(b),
                                lambda_=arr(lam))

    def decay_values(self, gamma):
        return self.decay if gamma is None else [float(g) for g in gamma.detach().reshape(-1)]


class _MapFunction(torch.autograd.Function):
    """Attention with a feature map whose parameters are inputs: w (a projection [m, D] or
    per-head weights [sets, m, D]), b [sets, m], lam [sets, m] and the decay gamma [1 or H],
    each None or a tensor; their gradients come from favor's backward with
    with_parameter_grads."""

    @staticmethod
    def forward(ctx, q, k, v, w, b, lam, gamma, spec):
        fm = spec.core_map(w, b, lam)
        decay = spec.decay_values(gamma)
        want_context = not spec.causal and any(ctx.needs_input_grad[:7])
        y, _, saved = _core.attention_map(T.view(q), T.view(k), T.view(v), fm, causal=spec.causal,
                                          key_mask=spec.keep, decay=decay,
                                          save_context=want_context)
        ctx.save_for_backward(q, k, v)
        ctx.fm, ctx.decay, ctx.saved, ctx.spec = fm, decay, saved, spec
        ctx.params = [None if t is None else (t.shape, t.dtype) for t in (w, b, lam, gamma)]
        return T.tensor(y)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        q, k, v = ctx.saved_tensors
        need = ctx.needs_input_grad
        grads = _core.attention_map_backward(
            T.view(q), T.view(k), T.view(v), T.view(dy.to(torch.float32)), ctx.fm,
            causal=ctx.spec.causal, key_mask=ctx.spec.keep, decay=ctx.decay,
            parameter_grads=any(need[3:7]), context=ctx.saved)
        out = [T.tensor(g) if need[i] else None for i, g in enumerate(grads[:3])]
        for i, (param, g) in enumerate(zip(ctx.params, grads[3:])):
            if need[3 + i]:
                shape, dtype = param
                out.append(torch.from_numpy(np.asarray(g)).to(dtype).reshape(shape))
            else:
                out.append(None)
        return (*out, None)


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


def _parameter(x, name):
    """A learned-map parameter as a float32 tensor (arrays become constant tensors)."""
    if x is None:
        return None
    if not isinstance(x, torch.Tensor):
        x = torch.from_numpy(np.asarray(x, dtype=np.float32))
    return T.as_float32(x, name)


def _check_parameters(inputs, d, m, params):
    """The per-head parameter tensors ((name, tensor) for weights [sets, m, D], bias and
    feature_weights [sets, m]) against the inputs (B, H), their D and the projection's m,
    errors naming the caller's argument (the C++ checks of the map made from them would name
    feature_map): 1, H or B*H sets, the same count for all, m rows per set, finite values
    (nonzero feature weights)."""
    first = None
    for name, t in params:
        if t is None:
            continue
        layout = "[sets, m, D]" if name == "weights" else "[sets, m]"
        if t.dim() != (3 if name == "weights" else 2):
            raise _core.Error(f"{name}: shape {list(t.shape)} must be {layout}")
        sets = t.shape[0]
        _check_set_count(sets, name, *inputs)
        if first is not None and sets != first[1]:
            raise _core.Error(f"{name}: has {sets} parameter sets along axis 0 but {first[0]} "
                              f"has {first[1]}; every parameter has the same sets")
        first = first or (name, sets)
        if t.shape[1] != m:
            raise _core.Error(f"{name}: shape {list(t.shape)} has {t.shape[1]} rows per set; "
                              f"the projection has m = {m}")
        if name == "weights" and t.shape[2] != d:
            raise _core.Error(f"{name}: shape {list(t.shape)} has D = {t.shape[2]}; the inputs "
                              f"have D = {d}")
        _check_values(T.view(t), name, nonzero=name == "feature_weights")


def _map_inputs(inputs, d, projection, features, norms, seed, kernel, scale, fit, feature_map,
                weights, bias, feature_weights):
    """(spec fields, w, b, lam) for _MapFunction: from a favor.FeatureMap (its arrays as
    constants; the drawing options must keep their defaults, as in favor.attention) or from
    the projection and the given parameter tensors (checked against the inputs (B, H))."""
    if feature_map is not None:
        if not isinstance(feature_map, FeatureMap):
            raise _core.Error(f"feature_map: must be a favor.FeatureMap, not "
                              f"{type(feature_map).__name__}")
        _check_map_defaults(dict(kernel=kernel, features=features, projection=projection,
                                 norms=norms, seed=seed, scale=scale, fit=fit))
        if any(t is not None for t in (weights, bias, feature_weights)):
            raise _core.Error("feature_map: carries its own weights, bias and lambda; give the "
                              "map or the tensors, not both")
        if feature_map.d != d:
            raise _core.Error(f"feature_map: has d = {feature_map.d}, the inputs have D = {d}")
        base = _core.Projection.from_matrix(feature_map.projection)
        arrays = (feature_map.weights, feature_map.bias, feature_map.lambda_)
        return ((base, feature_map.kernel, feature_map.scale, feature_map.fit),
                *(_parameter(a, n) for a, n in zip(arrays, ("weights", "bias", "lambda"))))
    wt = _parameter(weights, "weights")
    if wt is not None and wt.dim() not in (2, 3):
        raise _core.Error(f"weights: shape {list(wt.shape)} must be [sets, m, D] (per-head "
                          "projections) or [m, D] (the shared projection)")
    if wt is not None and features is None and isinstance(projection, str) and wt.dim() == 3:
        features = wt.shape[1]
    proj, w = resolve_projection(projection, d, features, norms, seed)
    if wt is not None:
        if w is not None:
            if w.requires_grad:
                raise _core.Error("projection: a projection tensor that requires grad is unused "
                                  "when per-head weights are given; pass it without grad")
            proj = T.projection_matrix(w, d)
        w = wt
    elif w is not None:
        T.projection_matrix(w, d)  # the shape check
    if proj is None:
        proj = T.projection_matrix(w if w.dim() == 2 else w[0], d)
    b, lam = _parameter(bias, "bias"), _parameter(feature_weights, "feature_weights")
    if lam is not None and lam.dim() == 1:
        lam = lam[None]  # [m]: one set, as in favor.attention
    _check_parameters(inputs, d, proj.m, (("weights", w if w is not None and w.dim() == 3
                                           else None), ("bias", b), ("feature_weights", lam)))
    return (proj, kernel, scale, _fit(fit, kernel, d, inputs)), w, b, lam


def attention(q, k, v, *, causal=False, kernel="positive", projection="orthogonal",
              features=None, norms="chi", seed=0, scale=None, key_padding_mask=None, fit=None,
              method="favor", feature_map=None, weights=None, bias=None, feature_weights=None,
              decay=None):
    """Differentiable FAVOR attention on CPU tensors (exact attention with method='exact').

    q [B, H, Nq, D], k [B, H, Nk, D], v [B, H, Nk, Dv] (or [N, D]) -> [B, H, Nq, Dv], in the
    dtype of q. float32 tensors are read in place (any strides); float64/float16/bfloat16
    are computed in float32. projection: a kind (drawn with `features` rows, `norms`,
    `seed`), a favor.Projection, or a float [m, D] tensor, which receives a gradient when it
    requires one (every kernel; FAVOR++/FAVOR# hold their fit fixed). key_padding_mask
    [B, Nk]: torch's convention, True (or -inf) = ignore the key. kernel, scale and fit as in favor.attention.
    The forward pass saves the key state for the backward (bidirectional); double backward
    is not supported.

    Learned feature maps (favor.FeatureMap; each tensor receives a gradient when it requires
    one, through favor's backward): weights [sets, m, D] per-head projections (the
    projection then only sets m), bias [sets, m], feature_weights (lambda) [sets, m] (or
    [m]: one set), with sets 1, H or B*H; errors in these name the argument. decay: gamma in
    (0, 1] (a float, a list, or a tensor [1] / [H], which is learned; causal only).
    feature_map: a favor.FeatureMap whose arrays are constants (it carries the kernel,
    projection, scale and fit, so kernel, features, projection, norms, seed, scale and fit
    must keep their defaults, as in favor.attention).
    """
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        T.check_tensor(t, name)
    T.follow_torch_threads()
    out_dtype = q.dtype
    q32, k32, v32 = T.as_float32(q, "q"), T.as_float32(k, "k"), T.as_float32(v, "v")
    keep = T.keep_mask(key_padding_mask)
    map_args = (feature_map, weights, bias, feature_weights, decay)
    if method == "exact" and any(x is not None for x in map_args):
        raise _core.Error("method: 'exact' takes no feature map, weights, bias, feature_weights "
                          "or decay")
    if method == "exact":
        y = _ExactFunction.apply(q32, k32, v32, _Spec(None, None, causal, scale, keep, None))
    elif method == "favor" and any(x is not None for x in map_args):
        d = q.shape[-1]
        (proj, kern, sc, ft), w, b, lam = _map_inputs(
            _batch_heads(q), d, projection, features, norms, seed, kernel, scale, fit,
            feature_map, weights, bias, feature_weights)
        gamma = None
        if isinstance(decay, torch.Tensor):
            T.check_tensor(decay, "decay")
            gamma = decay
        constant = None if gamma is not None else _decay(decay)
        spec = _MapSpec(proj, kern, sc, ft, causal, keep, constant)
        y = _MapFunction.apply(q32, k32, v32, w, b, lam, gamma, spec)
    elif method == "favor":
        d = q.shape[-1]
        proj, w = resolve_projection(projection, d, features, norms, seed)
        spec = _Spec(proj, kernel, causal, scale, keep, _fit(fit, kernel, d, _batch_heads(q)))
        y = _FavorFunction.apply(q32, k32, v32, w, spec)
    else:
        raise _core.Error(f"method: '{method}' is not a method; use favor or exact")
    return y if out_dtype == torch.float32 else y.to(out_dtype)
