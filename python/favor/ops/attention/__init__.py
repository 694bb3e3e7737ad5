"""favor.torch.attention: differentiable FAVOR (or exact) attention through favor's torch ops
(favor::attention, favor::exact_attention; favor/ops/attention/op.py, favor/ops/exact/op.py).

The function below turns the user's arguments (a projection kind, a favor.Projection or a
tensor; a KernelFit or a float; a favor.FeatureMap or parameter tensors; torch's key padding
mask) into the tensors and plain values of the ops, with the checks that need no values
(shapes, types, devices): it traces with no graph break. Checks of values (finite
parameters, a float mask of 0 / -inf) run inside the ops, in C++ where C++ knows the rule.
"""
import numpy as np
import torch

from ... import _args, _core
from ..._args import check_set_count as _check_set_count
from ...feature_map import FeatureMap
from .. import _tensors as T
from .. import _dispatch
from ..exact.op import exact_attention
from ..projection import projection as draw_projection
from . import paths
from .op import Formula, attention_op, eager, eager_attention, eager_mode, plain_inputs

__all__ = ["attention", "check_parameters", "fit_tensors", "projection_tensor"]


def projection_tensor(projection, d, features, norms, seed):
    """The projection as a tensor [m, d]: a kind is drawn by favor::projection (inside a
    compiled graph too), a favor.Projection gives its matrix, a tensor is used as it is (it
    takes part in autograd: its gradient is dL/dW)."""
    if isinstance(projection, torch.Tensor):
        if features is not None and features != projection.shape[0]:
            raise _core.Error(f"features: {features} differs from the projection tensor's "
                              f"m = {projection.shape[0]}")
        T.check_tensor(projection, "projection")
        if projection.dim() != 2 or projection.shape[1] != d:
            raise _core.Error(f"projection: tensor of shape {list(projection.shape)} must be "
                              f"[m, {d}] (D = {d})")
        return T.as_float32(projection, "projection")
    if isinstance(projection, str):
        return draw_projection(projection, _args.DEFAULT_FEATURES if features is None else features,
                               d, norms, seed)
    p = _args.make_projection(d, projection, features=features, norms=norms, seed=seed)
    return torch.from_numpy(np.array(p.matrix))


def fit_tensors(fit, kernel, d, inputs):
    """(a [heads, d], basis [heads, d, d]) float64 of a FAVOR++ / FAVOR# fit, or (None, None):
    fit is a favor.KernelFit, a float A (FAVOR++), or already such a pair of tensors (what
    modules keep). A fit with one entry per head is repeated over the batch (inputs (B, H))."""
    if fit is None:
        return None, None
    if isinstance(fit, tuple):
        a, basis = fit
    else:
        kf = _args.fit_for(fit, kernel, d)
        a, basis = torch.from_numpy(np.asarray(kf.a)), torch.from_numpy(np.asarray(kf.basis))
    b, h = inputs
    if b > 1 and h > 1 and a.shape[0] == h:
        a, basis = a.repeat(b, 1), basis.repeat(b, 1, 1)
    return a, basis


def check_parameters(inputs, d, m, params):
    """The shapes of per-head parameter tensors ((name, tensor) for weights [sets, m, D],
    bias and feature_weights [sets, m]) against the inputs (B, H), their D and the
    projection's m, errors naming the caller's argument: 1, H or B*H sets, the same count for
    all, m rows per set. (Their values are checked in the op.)"""
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


def parameter_tensor(x, name):
    """A learned-map parameter as a float32 tensor (arrays become constant tensors)."""
    if x is None:
        return None
    if not isinstance(x, torch.Tensor):
        x = torch.from_numpy(np.asarray(x, dtype=np.float32))
    return T.as_float32(x, name)


def _decay_tensor(decay):
    """decay (None, a float, a list, or a tensor [1] / [H], learned when it requires grad) as
    a float64 1-D tensor, or None."""
    if decay is None:
        return None
    if isinstance(decay, torch.Tensor):
        T.check_tensor(decay, "decay")
        return decay.to(torch.float64).reshape(-1)
    gammas = _args.decay_values(decay)
    return torch.tensor(gammas, dtype=torch.float64, device="cpu") if gammas else None


def _map_tensors(inputs, d, projection, features, norms, seed, kernel, scale, fit, feature_map,
                 weights, bias, feature_weights):
    """(w, weights, bias, lam, kernel, scale, fit) for the op: from a favor.FeatureMap (its
    arrays as constants; the drawing options must keep their defaults, as in
    favor.attention) or from the projection and the given parameter tensors."""
    if feature_map is not None:
        if not isinstance(feature_map, FeatureMap):
            raise _core.Error(f"feature_map: must be a favor.FeatureMap, not "
                              f"{type(feature_map).__name__}")
        _args.check_map_defaults(dict(kernel=kernel, features=features, projection=projection,
                                     norms=norms, seed=seed, scale=scale, fit=fit))
        if any(t is not None for t in (weights, bias, feature_weights)):
            raise _core.Error("feature_map: carries its own weights, bias and lambda; give the "
                              "map or the tensors, not both")
        if feature_map.d != d:
            raise _core.Error(f"feature_map: has d = {feature_map.d}, the inputs have D = {d}")
        arrays = (feature_map.projection, feature_map.weights, feature_map.bias,
                  feature_map.lambda_)
        w, wt, b, lam = (parameter_tensor(a, n)
                         for a, n in zip(arrays, ("projection", "weights", "bias", "lambda")))
        return w, wt, b, lam, feature_map.kernel, feature_map.scale, feature_map.fit
    wt = parameter_tensor(weights, "weights")
    if wt is not None and wt.dim() not in (2, 3):
        raise _core.Error(f"weights: shape {list(wt.shape)} must be [sets, m, D] (per-head "
                          "projections) or [m, D] (the shared projection)")
    if wt is not None and features is None and isinstance(projection, str) and wt.dim() == 3:
        features = wt.shape[1]
    w = projection_tensor(projection, d, features, norms, seed)
    if wt is not None and wt.dim() == 2:  # [m, D] weights replace the shared projection
        if w.requires_grad:
            raise _core.Error("projection: a projection tensor that requires grad is unused "
                              "when weights are given; pass it without grad")
        if wt.shape[1] != d:
            raise _core.Error(f"projection: tensor of shape {list(wt.shape)} must be [m, {d}] "
                              f"(D = {d})")
        w, wt = wt, None
    elif wt is not None and w.requires_grad:
        raise _core.Error("projection: a projection tensor that requires grad is unused when "
                          "per-head weights are given; pass it without grad")
    b, lam = parameter_tensor(bias, "bias"), parameter_tensor(feature_weights, "feature_weights")
    if lam is not None and lam.dim() == 1:
        lam = lam[None]  # [m]: one set, as in favor.attention
    check_parameters(inputs, d, w.shape[0], (("weights", wt), ("bias", b),
                                             ("feature_weights", lam)))
    return w, wt, b, lam, kernel, scale, fit


def _eager_favor(q, k, v, mask, d, projection, features, norms, seed, fit, kernel, causal, scale,
                 precision, window=0, sinks=0):
    """FAVOR attention through the C++ call without the op (eager() or plain_inputs() said
    so): a drawn projection from the cache, a projection tensor as a favor.Projection."""
    if isinstance(projection, torch.Tensor):
        w = projection_tensor(projection, d, features, norms, seed)
        proj = _core.Projection.from_matrix(T.array(w))
    else:
        proj = _args.make_projection(d, projection, features=features, norms=norms, seed=seed)
    fit_a, fit_basis = (None, None) if fit is None else fit_tensors(fit, kernel, d,
                                                                    _args.batch_heads(q))
    return eager_attention(q, k, v, proj, mask, fit_a, fit_basis, kernel, bool(causal),
                           _args.optional_number(scale, "scale"), str(precision), window, sinks)


@T.names_key_padding_mask
def attention(q, k, v, *, causal=False, kernel="positive", projection="orthogonal",
              features=None, norms="chi", seed=0, scale=None, key_padding_mask=None, fit=None,
              method="favor", feature_map=None, weights=None, bias=None, feature_weights=None,
              decay=None, backend=None, precision="f32", save_causal_states=False, window=0,
              sinks=0):
    """Differentiable FAVOR attention (exact attention with method='exact') on torch tensors.

    q [B, H, Nq, D], k [B, H, Nk, D], v [B, H, Nk, Dv] (or [N, D]) -> [B, H, Nq, Dv], in the
    dtype of q. float32 tensors are read in place (any strides); float64/float16/bfloat16
    are cast to float32 (a copy), computed in float32 and the output cast back (the
    'triton' path reads float16/bfloat16 directly, computing in float32). projection: a
    kind (drawn with `features` rows, `norms`, `seed`, by the op favor::projection), a
    favor.Projection, or a float [m, D] tensor, which receives a gradient when it requires
    one (every kernel; FAVOR++/FAVOR# hold their fit fixed). key_padding_mask [B, Nk]:
    torch's convention, True (or -inf) = ignore the key. kernel, scale and fit as in
    favor.attention. The forward saves the key state for the backward (bidirectional);
    double backward is not supported. Runs the torch ops favor::attention and
    favor::exact_attention: torch.compile and torch.export trace it as one node.

    Learned feature maps (favor.FeatureMap; each tensor receives a gradient when it requires
    one, through favor's backward): weights [sets, m, D] per-head projections (the
    projection then only sets m), bias [sets, m], feature_weights (lambda) [sets, m] (or
    [m]: one set), with sets 1, H or B*H; errors in these name the argument. decay: gamma in
    (0, 1] (a float, a list, or a tensor [1] / [H], which is learned; causal only).
    feature_map: a favor.FeatureMap whose arrays are constants (it carries the kernel,
    projection, scale and fit, so kernel, features, projection, norms, seed, scale and fit
    must keep their defaults, as in favor.attention).

    backend: None (torch's dispatcher picks the op's kernel by the tensors' device: CPU -> the
    C++ kernels; CUDA -> the fused Triton kernels (head dims they take; else plain torch);
    other devices -> plain torch operations), or one forced, for tests and debugging
    (ops/_dispatch.py): 'cpu', 'torch' (plain torch operations on any device; favor/ops/
    attention/generic.py), 'triton' (CUDA tensors; CPU tensors under TRITON_INTERPRET=1).
    Every kernel computes the same formula with the same stabiliser and the same errors,
    under one autograd formula (docs/gpu.md).

    precision: 'f32', or 'bf16' on the 'cpu' path: the forward's GEMMs in bfloat16 with
    fp32 accumulation where favor.bf16_available() (AVX512-BF16 and oneDNN; bidirectional;
    elsewhere f32), the backward in float32 (docs/numerics.md, "bf16 forward"). bfloat16
    tensors are converted to float32 as above whatever the precision (then 'bf16' rounds
    nothing more of q, k, v). The other paths compute as they do and ignore it.
    save_causal_states: causal, 'cpu' path, under autograd: the forward keeps each 32-token
    chunk's state and every row's [num | den] (N (F / 32 + 1) (Dv + 1) floats per head) so
    that the backward runs one sweep instead of recomputing the forward (C++
    AttentionOptions::save_causal_states; docs/gradients.md). Same gradients, more memory.
    With window or sinks (causal or bidirectional) it keeps the estimated parts' states and
    rows and the merged rows; the backward then skips the forward (docs/numerics.md, "Hybrid
    attention"); without it a hybrid call's backward recomputes the forward.

    method='window': the window and the sinks alone (exact softmax, the estimator removed:
    the baseline a hybrid must beat; the op favor::exact_attention with window and sinks:
    C++'s band kernel on the CPU, plain torch elsewhere).
    window, sinks (method='favor' or 'window', Nq = Nk): hybrid attention (docs/math.md, "Hybrid
    attention"): exact softmax on each query's last `window` keys (causal; bidirectional
    |i - j| < window) and on the first `sinks` keys the mask keeps, the estimator on the
    others, one normaliser (decay counts from the window's edge). 0, 0: the plain method.
    Every kernel takes them ('triton': the exact part fused, the rest in torch).
    """
    window, sinks = _args.hybrid_sizes(window, sinks)
    if (method == "favor" and _dispatch.cpu_kernel_runs(backend)
            and not isinstance(projection, torch.Tensor)
            and feature_map is None and weights is None and bias is None
            and feature_weights is None and decay is None
            and plain_inputs(q, k, v, key_padding_mask) and eager_mode()):
        # The eager CPU call without grad (most of a tiny call's time is this layer): the
        # general path below with the checks these inputs pass by construction left out;
        # the C++ call checks shapes and values as it always does.
        return _eager_favor(q, k, v, T.check_mask(key_padding_mask), _args.head_dim(q, "q"),
                            projection, features, norms, seed, fit, kernel, causal, scale,
                            precision, window, sinks)
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        T.check_tensor(t, name)
    out_dtype = q.dtype
    halves = (torch.float16, torch.bfloat16)
    if q.is_cuda and all(t.dtype in halves for t in (q, k, v)):
        q32, k32, v32 = q, k, v  # CUDA's fused kernels read half precision themselves
    else:
        q32, k32, v32 = T.as_float32(q, "q"), T.as_float32(k, "k"), T.as_float32(v, "v")
    mask = T.check_mask(key_padding_mask)
    T.check_same_device(q, ((k, "k"), (v, "v")))
    follow = lambda t: None if t is None else t.to(q.device)  # noqa: E731 (differentiable)
    mask = follow(mask)  # a mask and map tensors follow q's device
    map_args = (feature_map, weights, bias, feature_weights, decay)
    if method == "exact":
        if any(x is not None for x in map_args) or window or sinks:
            raise _core.Error("method: 'exact' takes no feature map, weights, bias, "
                              "feature_weights, decay, window or sinks")
        y = exact_attention(q32, k32, v32, mask, bool(causal), scale, backend=backend)
    elif method == "favor":
        forced = _dispatch.forced("attention", backend, q)
        d, inputs = _args.head_dim(q, "q"), _args.batch_heads(q)
        if any(x is not None for x in map_args):
            w, wt, b, lam, kernel, scale, fit = _map_tensors(
                inputs, d, projection, features, norms, seed, kernel, scale, fit, feature_map,
                weights, bias, feature_weights)
            gamma = _decay_tensor(decay)
        else:
            w_in = projection if isinstance(projection, torch.Tensor) else None
            if _dispatch.cpu_kernel_runs(backend, q32, k32, v32, mask, w_in) \
                    and eager((q32, k32, v32, mask, w_in)):  # the CPU kernel, no op dispatch
                y = _eager_favor(q32, k32, v32, mask, d, projection, features, norms, seed, fit,
                                 kernel, causal, scale, precision, window, sinks)
                return y if out_dtype == torch.float32 else y.to(out_dtype)
            w = projection_tensor(projection, d, features, norms, seed)
            wt = b = lam = gamma = None
        fit_a, fit_basis = fit_tensors(fit, kernel, d, inputs)
        w, wt, b, lam, gamma, fit_a, fit_basis = (follow(t) for t in (w, wt, b, lam, gamma,
                                                                      fit_a, fit_basis))
        tensors = (q32, k32, v32, w, wt, b, lam, gamma)
        # a plain bidirectional call saves its key state; a causal or hybrid one its chunk
        # states, rows (and merge) only when asked (more memory: save_causal_states)
        save = ((not (causal or window or sinks) or save_causal_states)
                and torch.is_grad_enabled()
                and any(t is not None and t.requires_grad for t in tensors))
        args = (*tensors, mask, fit_a, fit_basis, kernel, bool(causal),
                _args.optional_number(scale, "scale"), save, str(precision), window, sinks)
        if forced is None:
            y = attention_op(*args)[0]
        else:
            y = _dispatch.ForcedAutograd.apply(Formula, *forced, *args)[0]
    elif method == "window":
        if any(x is not None for x in map_args):
            raise _core.Error("method: 'window' takes no feature map, weights, bias, "
                              "feature_weights or decay (it has no estimator)")
        y = _window(q32, k32, v32, mask, bool(causal), scale, window, sinks, backend)
    else:
        raise _core.Error(f"method: '{method}' is not a method; use favor, exact or window")
    return y if out_dtype == torch.float32 else y.to(out_dtype)


def _window(q, k, v, mask, causal, scale, window, sinks, backend=None):
    """method='window': hybrid attention's exact part alone, favor::exact_attention with
    window and sinks (CPU: C++'s band kernel; elsewhere the torch band), whose kernels check
    the inputs (not here: a compiled call traces this)."""
    if not (window or sinks):
        raise _core.Error("window, sinks: method='window' attends to the window and the sinks "
                          "only; give window > 0 or sinks > 0")
    return exact_attention(q, k, v, mask, causal, scale, backend=backend, window=window,
                           sinks=sinks)
