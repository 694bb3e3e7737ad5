"""The map arguments of favor.distributed.attention as the sequence-parallel autograd function
takes them: a favor.Projection (or a projection tensor), the kernel, scale and fit, and the
parameter tensors of a learned map, checked against the inputs (favor.torch.attention itself
passes tensors to the op favor::attention; favor/ops/attention)."""
import numpy as np
import torch

from .. import _core
from .._args import check_map_defaults, fit_for, make_projection
from .._args import check_values as _check_values
from ..feature_map import FeatureMap
from ..ops import _tensors as T
from ..ops.attention import check_parameters, parameter_tensor


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


def resolve_projection(projection, d, features, norms, seed):
    """(favor.Projection or None, float32 tensor W or None) for a kind, a Projection or an
    [m, d] tensor (a tensor takes part in autograd: its gradient is dL/dW)."""
    if isinstance(projection, torch.Tensor):
        if features is not None and features != projection.shape[0]:
            raise _core.Error(f"features: {features} differs from the projection tensor's "
                              f"m = {projection.shape[0]}")
        return None, T.as_float32(projection, "projection")
    # a kind or a favor.Projection (make_projection caches a draw per kind, m, d, norms, seed)
    return make_projection(d, projection, features=features, norms=norms, seed=seed), None


def _check_parameters(inputs, d, m, params):
    """Shapes (ops.attention.check_parameters) and values (finite; nonzero feature weights)
    of the per-head parameter tensors."""
    check_parameters(inputs, d, m, params)
    for name, t in params:
        if t is not None:
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
        check_map_defaults(dict(kernel=kernel, features=features, projection=projection,
                                 norms=norms, seed=seed, scale=scale, fit=fit))
        if any(t is not None for t in (weights, bias, feature_weights)):
            raise _core.Error("feature_map: carries its own weights, bias and lambda; give the "
                              "map or the tensors, not both")
        if feature_map.d != d:
            raise _core.Error(f"feature_map: has d = {feature_map.d}, the inputs have D = {d}")
        base = _core.Projection.from_matrix(feature_map.projection)
        arrays = (feature_map.weights, feature_map.bias, feature_map.lambda_)
        return ((base, feature_map.kernel, feature_map.scale, feature_map.fit),
                *(parameter_tensor(a, n) for a, n in zip(arrays, ("weights", "bias", "lambda"))))
    wt = parameter_tensor(weights, "weights")
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
    b, lam = parameter_tensor(bias, "bias"), parameter_tensor(feature_weights, "feature_weights")
    if lam is not None and lam.dim() == 1:
        lam = lam[None]  # [m]: one set, as in favor.attention
    _check_parameters(inputs, d, proj.m, (("weights", w if w is not None and w.dim() == 3
                                           else None), ("bias", b), ("feature_weights", lam)))
    return (proj, kernel, scale, fit_for(fit, kernel, d, inputs)), w, b, lam
