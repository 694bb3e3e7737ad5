"""What favor::attention's tensors mean, shared by its kernels (op.py for the CPU, kernels.py
for the others) and by the ops built on it: the favor._core.FeatureMap of the op's map
tensors (whose C++ checks every kernel applies) and the shapes of the backward's outputs."""
import torch

from ... import _core
from ..._args import check_values as _check_values
from .. import _tensors as T


def uses_map(weights, bias, lam, decay):
    """True when the op's map is a learned one (any of weights, bias, lam, decay given)."""
    return any(t is not None for t in (weights, bias, lam, decay))


def feature_map(w, weights, bias, lam, fit_a, fit_basis, kernel, scale):
    """The favor._core.FeatureMap of the op's map tensors (w [m, D] the projection; weights
    [sets, m, D], bias and lam [sets, m] or None; a fit as (a, basis) or None), after the
    checks of their values (finite; nonzero feature weights)."""
    for t, name, nonzero in ((weights, "weights", False), (bias, "bias", False),
                             (lam, "feature_weights", True)):
        if t is not None:
            _check_values(T.view(t), name, nonzero=nonzero)
    proj = _core.Projection.from_matrix(T.array(w))
    fit = None if fit_a is None else _core.KernelFit(T.array(fit_a), T.array(fit_basis))
    sets = [t.shape[0] for t in (weights, bias, lam) if t is not None]
    return _core.FeatureMap(proj, kernel=kernel, scale=scale, fit=fit,
                            heads=sets[0] if sets else 1, weights=T.array(weights),
                            bias=T.array(bias), lambda_=T.array(lam))


def decay_list(decay):
    """The op's decay tensor (None or gamma per head) as the list of floats C++ takes."""
    return [] if decay is None else [float(g) for g in decay.detach().cpu().reshape(-1)]


def backward_fake(q, k, v, w, weights, bias, lam, decay, parameter_grads):
    """The outputs of a backward op (favor::attention_backward,
    favor::sequence_parallel_attention_backward) as empty tensors of their shapes."""
    like = lambda t, shape, dtype=torch.float32: t.new_empty(shape, dtype=dtype)
    grads = (like(q, q.shape), like(k, k.shape), like(v, v.shape))
    if not parameter_grads:
        return (*grads, like(q, 0), like(q, 0), like(q, 0), like(q, 0, torch.float64))
    if not uses_map(weights, bias, lam, decay):
        return (*grads, like(q, w.shape), like(q, 0), like(q, 0), like(q, 0, torch.float64))
    shape = lambda t: 0 if t is None else t.shape
    return (*grads, like(q, weights.shape if weights is not None else w.shape),
            like(q, shape(bias)), like(q, shape(lam)),
            like(q, shape(decay), torch.float64))
