"""The numpy API: one function per C++ entry point, the CLI's option names.

Shapes: q [B, H, Nq, D], k [B, H, Nk, D], v [B, H, Nk, Dv] -> [B, H, Nq, Dv]; or all 2-D
([N, D], one head) -> 2-D. key_mask: [B, Nk] ([Nk] for 2-D inputs), bool or integer,
nonzero = the key takes part (the CLI's --key-mask; torch's key_padding_mask is the
opposite and is handled in favor.torch).
"""
import os
from collections import namedtuple

import numpy as np

from . import _core
from ._args import (DEFAULT_FEATURES, DRAW_DEFAULTS, KERNEL_NAMES, Streaming,  # noqa: F401
                    batch_heads, check_map_defaults, check_set_count, check_values, decay_values,
                    fit_for, head_dim, hybrid_sizes, integer, kernel_name, make_projection,
                    parameter_sets)
from .feature_map import FeatureMap

# The names favor.torch and favor.distributed import from here (they live in _args now).
_batch_heads, _check_map_defaults, _decay = batch_heads, check_map_defaults, decay_values
_fit, _head_dim, _DRAW_DEFAULTS = fit_for, head_dim, DRAW_DEFAULTS

AttentionOutput = namedtuple("AttentionOutput", ["y", "context", "zero_rows"])
AttentionOutput.__doc__ = """attention(..., full_output=True): the output y, the saved key
state for the backward pass (bidirectional FAVOR; None otherwise) and the number of query
rows written as zeros (no visible key, or a trig denominator <= 0)."""
Grads = namedtuple("Grads", ["dq", "dk", "dv", "dw"])
Grads.__doc__ = "dL/dq, dL/dk, dL/dv (shapes of q, k, v) and dL/dW ([m, D], or None)."
FeatureMapGrads = namedtuple("FeatureMapGrads",
                             ["dq", "dk", "dv", "dw", "dbias", "dlambda", "ddecay"])
FeatureMapGrads.__doc__ = """attention_backward(..., parameter_grads=True): dL/dq, dL/dk, dL/dv
and the gradients of the map's parameters: dw [heads, m, D] when the map has weights (else
dL/dW of the shared projection, [m, D]), dbias and dlambda [heads, m] (None when the map has
no bias / lambda), ddecay (float64, one per decay value; None without decay)."""


def _lambda(feature_weights):
    """feature_weights (an array [m] / [heads, m] or a .npy path) as float32 [heads, m], its
    values finite and nonzero (errors name feature_weights)."""
    if isinstance(feature_weights, (str, os.PathLike)):
        try:
            feature_weights = np.load(os.fspath(feature_weights), allow_pickle=False)
        except (OSError, ValueError) as e:
            raise _core.Error(f"feature_weights: cannot read '{os.fspath(feature_weights)}' "
                              f"as .npy ({e})") from None
        if not isinstance(feature_weights, np.ndarray):
            raise _core.Error("feature_weights: a .npz file is a whole map; pass it as "
                              "feature_map=")
    lam = parameter_sets(feature_weights, "feature_weights", 1, None)
    check_values(lam, "feature_weights", nonzero=True)
    return lam


def _core_map(d, feature_map, feature_weights, decay, draw, force=False, inputs=None):
    """The favor._core.FeatureMap of a call, or None for the Projection path: feature_map
    itself (a FeatureMap or a path to a saved one; the drawing options `draw` must then keep
    their defaults), or the drawn projection with the kernel, scale, fit and feature_weights
    of the call (when feature_weights or decay is given, or `force`). inputs: (B, H) of the
    call, which the feature_weights' sets are checked against (errors name feature_weights,
    not the map made from them) and a map's per-head fit is repeated to."""
    if feature_map is not None:
        check_map_defaults(draw)
        if feature_weights is not None:
            raise _core.Error("feature_weights: the feature_map carries its own lambda; give one "
                              "or the other")
        if isinstance(feature_map, (str, os.PathLike)):
            feature_map = FeatureMap.load(feature_map)
        if not isinstance(feature_map, FeatureMap):
            raise _core.Error(f"feature_map: must be a favor.FeatureMap or the path of a saved "
                              f"one, not {type(feature_map).__name__}")
        if d is not None and feature_map.d != d:
            raise _core.Error(f"feature_map: has d = {feature_map.d}; the inputs have head dim "
                              f"D = {d}")
        if feature_map.fit is None or inputs is None or \
                not all(integer(x) is not None for x in inputs):
            return feature_map.core()
        # a fit with one entry per head (fitted on [1, H, N, D]) repeated over the batch, as
        # fit= is on the projection path
        with_fit = feature_map.copy()
        with_fit.fit = fit_for(feature_map.fit, feature_map.kernel, feature_map.d, tuple(inputs))
        return with_fit.core()
    if feature_weights is None and decay is None and not force:
        return None
    lam = None if feature_weights is None else _lambda(feature_weights)
    features = draw["features"]
    if features is None and lam is not None:
        features = lam.shape[-1]
    w = make_projection(d, draw["projection"], features=features, norms=draw["norms"],
                        seed=draw["seed"])
    if lam is not None:
        if lam.shape[1] != w.m:
            raise _core.Error(f"feature_weights: has {lam.shape[1]} weights per set; the "
                              f"projection has m = {w.m} rows (one weight per row)")
        if inputs is not None and all(integer(x) is not None and x >= 1 for x in inputs):
            check_set_count(lam.shape[0], "feature_weights", *inputs)
    kernel = draw["kernel"]
    ok = inputs is not None and all(integer(x) is not None for x in inputs)
    fit = fit_for(draw["fit"], kernel, d, tuple(inputs) if ok else None)
    return _core.FeatureMap(w, kernel=kernel, scale=draw["scale"], fit=fit,
                            heads=1 if lam is None else lam.shape[0], lambda_=lam)


def attention(q, k, v, *, method="favor", causal=False, kernel="positive", features=None,
              projection="orthogonal", norms="chi", seed=0, scale=None, key_mask=None,
              fit=None, accumulate="f32", full_output=False, codebook=None, tau=0.0, block=None,
              feature_map=None, feature_weights=None, decay=None, precision="f32", window=0,
              sinks=0):
    """Attention y = softmax(scale q.k) v, estimated by FAVOR (method='favor'), exact, or
    Transformer-VQ (method='vq': over keys quantised to `codebook`, see favor.vq_attention).

    q [B, H, Nq, D], k [B, H, Nk, D], v [B, H, Nk, Dv] (or 2-D [N, D]) -> y [B, H, Nq, Dv].
    kernel: positive | trig | hyperbolic | favorpp | favorsharp | hedgehog. projection: a kind (iid,
    orthogonal, radial, qmc, sorf, simplex, dct; drawn with `features` rows, `norms`, `seed`) or a
    favor.Projection. scale: the temperature, default 1/sqrt(D). key_mask: [B, Nk], nonzero =
    the key takes part. fit: FAVOR++/FAVOR# parameters (favor.KernelFit, or a float A for
    favorpp); causal needs one. accumulate (exact only): 'f32' or 'f64'.
    full_output=True returns AttentionOutput(y, context, zero_rows); the context saves the
    key state for attention_backward (bidirectional FAVOR only).
    method='vq' takes codebook ([c, D], [H, c, D] or a favor.Codebook), tau (0: hard VQ)
    and block (the causal block length; None: favor's default); full_output gives
    AttentionOutput(y, None, zero_rows).
    feature_map (favor.FeatureMap, or the path of a saved .npz): any map, learned ones
    included (hedgehog; per-head weights, bias, lambda); it carries the kernel, projection,
    scale and fit, which must then keep their defaults. feature_weights: lambda alone
    ([m] or [heads, m], or a .npy path) on the drawn projection and kernel (only lambda^2
    enters). decay: gamma in (0, 1], one value or one per head: causal attention weights
    times gamma^(i - j) (DiJiang, RetNet); 1 is no decay.
    precision (FAVOR): 'f32', or 'bf16': inputs, projection and features rounded to bfloat16
    for the GEMMs, fp32 accumulation, states and output, where favor.bf16_available()
    (AVX512-BF16 and oneDNN); bidirectional only. Elsewhere 'bf16' runs the f32 path
    (docs/numerics.md, "bf16 forward").
    window, sinks (FAVOR; Nq = Nk): hybrid attention (docs/math.md, "Hybrid attention"):
    exact softmax on each query's last `window` keys (causal; bidirectional: |i - j| <
    window) and on the first `sinks` visible keys, the estimator on every other key, one
    normaliser; decay then counts from the window's edge. 0 and 0: the plain method.
    """
    window, sinks = hybrid_sizes(window, sinks)
    if method != "favor":
        for name, value in (("feature_map", feature_map), ("feature_weights", feature_weights),
                            ("decay", decay), ("window", window or None),
                            ("sinks", sinks or None)):
            if value is not None:
                raise _core.Error(f"{name}: only method='favor' takes a {name} "
                                  f"(method is '{method}')")
        if precision != "f32":
            raise _core.Error(f"precision: only method='favor' takes precision='{precision}' "
                              f"(method is '{method}')")
    if codebook is not None and method != "vq":
        raise _core.Error(f"codebook: only method='vq' takes a codebook (method is '{method}')")
    if method == "vq":
        if codebook is None:
            raise _core.Error("codebook: method='vq' needs a codebook ([c, D], [H, c, D] or a "
                              "favor.Codebook)")
        from .vq import vq_attention  # deferred: `import favor.api` alone need not load vq
        y, zero_rows = vq_attention(q, k, v, codebook, causal=causal, scale=scale,
                                    key_mask=key_mask, tau=tau, block=block, full_output=True)
        return AttentionOutput(y, None, zero_rows) if full_output else y
    if method == "exact":
        kernel_name(kernel)  # the CLI parses --kernel whatever the method
        y = _core.exact_attention(q, k, v, causal=causal, scale=scale, key_mask=key_mask,
                                  accumulate=accumulate)
        return AttentionOutput(y, None, 0) if full_output else y
    if method != "favor":
        raise _core.Error(f"method: '{method}' is not a method; use favor, exact or vq")
    d = head_dim(q, "q")
    draw = dict(kernel=kernel, features=features, projection=projection, norms=norms,
                seed=seed, scale=scale, fit=fit)
    fm = _core_map(d, feature_map, feature_weights, decay, draw, inputs=batch_heads(q))
    if fm is not None:
        y, zero_rows, context = _core.attention_map(q, k, v, fm, causal=causal, key_mask=key_mask,
                                                    decay=decay_values(decay),
                                                    save_context=full_output,
                                                    precision=precision, window=window,
                                                    sinks=sinks)
        return AttentionOutput(y, context, zero_rows) if full_output else y
    w = make_projection(d, projection, features=features, norms=norms, seed=seed)
    y, zero_rows, context = _core.attention(q, k, v, w, kernel=kernel, causal=causal,
                                            scale=scale, key_mask=key_mask,
                                            fit=fit_for(fit, kernel, d, batch_heads(q)),
                                            save_context=full_output, precision=precision,
                                            window=window, sinks=sinks)
    return AttentionOutput(y, context, zero_rows) if full_output else y


def exact_attention(q, k, v, *, causal=False, scale=None, key_mask=None, accumulate="f32"):
    """Exact softmax attention, blockwise with an online softmax (never N x N).
    Same shapes as attention(); rows with no visible key are zeros."""
    return _core.exact_attention(q, k, v, causal=causal, scale=scale, key_mask=key_mask,
                                 accumulate=accumulate)


def attention_backward(q, k, v, dy, *, causal=False, kernel="positive", features=None,
                       projection="orthogonal", norms="chi", seed=0, scale=None, key_mask=None,
                       fit=None, projection_grad=False, context=None, feature_map=None,
                       feature_weights=None, decay=None, parameter_grads=False, window=0,
                       sinks=0):
    """Gradients of attention() (method='favor') for dy = dL/dy [B, H, Nq, Dv]: returns
    Grads(dq, dk, dv, dw), dw = dL/dW [m, D] when projection_grad, else None. Give the same
    inputs and options as the forward call (feature_map, feature_weights and decay
    included); `context` (from attention(..., full_output=True)) skips recomputing the key
    state and is refused if it came from other inputs. parameter_grads=True returns
    FeatureMapGrads(dq, dk, dv, dw, dbias, dlambda, ddecay): the gradients of the map's
    learned parameters and of the decay as well."""
    window, sinks = hybrid_sizes(window, sinks)
    if context is not None and not isinstance(context, _core.AttentionContext):
        raise _core.Error(f"context: must be the AttentionContext of attention(..., "
                          f"full_output=True), not {type(context).__name__}")
    d = head_dim(q, "q")
    draw = dict(kernel=kernel, features=features, projection=projection, norms=norms,
                seed=seed, scale=scale, fit=fit)
    fm = _core_map(d, feature_map, feature_weights, decay, draw, force=parameter_grads,
                   inputs=batch_heads(q))
    if fm is not None:
        g = _core.attention_map_backward(q, k, v, dy, fm, causal=causal, key_mask=key_mask,
                                         decay=decay_values(decay),
                                         parameter_grads=parameter_grads or projection_grad,
                                         context=context, window=window, sinks=sinks)
        if parameter_grads:
            return FeatureMapGrads(*g)
        return Grads(*g[:3], g[3] if projection_grad else None)
    w = make_projection(d, projection, features=features, norms=norms, seed=seed)
    return Grads(*_core.attention_backward(q, k, v, dy, w, kernel=kernel, causal=causal,
                                           scale=scale, key_mask=key_mask,
                                           fit=fit_for(fit, kernel, d, batch_heads(q)),
                                           projection_grad=projection_grad, context=context,
                                           window=window, sinks=sinks))


def exact_attention_backward(q, k, v, dy, *, causal=False, scale=None, key_mask=None):
    """Gradients of exact_attention(): Grads(dq, dk, dv, None)."""
    return Grads(*_core.exact_attention_backward(q, k, v, dy, causal=causal, scale=scale,
                                                 key_mask=key_mask))


def features(x, *, kernel="positive", features=None, projection="orthogonal", norms="chi",
             seed=0, scale=None, fit=None, feature_map=None, feature_weights=None):
    """The exact feature map phi(x) with every constant (docs/math.md): x [B, H, N, D] or
    [N, D] -> [..., F], F = m (positive, favorpp, favorsharp) or 2m (trig, hyperbolic,
    hedgehog), so that phi(q).phi(k) estimates exp(scale q.k) without bias (the random maps).
    With a feature_map (or feature_weights: lambda), its phi: each feature of row f times
    lambda_f (favor.FeatureMap). Raises if a feature overflows float32 (attention()
    stabilises; this map does not)."""
    d = head_dim(x, "x")
    draw = dict(kernel=kernel, features=features, projection=projection, norms=norms,
                seed=seed, scale=scale, fit=fit)
    fm = _core_map(d, feature_map, feature_weights, None, draw, inputs=batch_heads(x))
    if fm is not None:
        return _core.features_map(x, fm)
    w = make_projection(d, projection, features=features, norms=norms, seed=seed)
    return _core.features(x, w, kernel=kernel, scale=scale, fit=fit_for(fit, kernel, d))


def fit_kernel(kernel, q, k, *, scale=None, key_mask=None):
    """FAVOR++ (kernel='favorpp') or FAVOR# ('favorsharp') parameters fitted to q and k,
    one per (batch, head): a favor.KernelFit for attention(fit=...) and Decoder."""
    return _core.fit_kernel(kernel, q, k, scale=scale, key_mask=key_mask)


def kernel_mse(x, y, *, kernel="positive", features=None, projection="orthogonal", norms="chi",
               seed=0, scale=None, fit=None):
    """Mean over all pairs of (phi(x_i).phi(y_j) - exp(scale x_i.y_j))^2, in double, for
    x [Nx, D] and y [Ny, D]. O(Nx Ny F): small problems only."""
    d = head_dim(x, "x")
    w = make_projection(d, projection, features=features, norms=norms, seed=seed)
    return _core.kernel_mse(x, y, w, kernel=kernel, scale=scale, fit=fit_for(fit, kernel, d))


class Decoder(Streaming):
    """Streaming (autoregressive) FAVOR decoding with a fixed-size state per (batch, head).

    Decoder(batch, heads, dv, projection, kernel='positive', scale=None, fit=None,
    feature_map=None, feature_weights=None, decay=None) (with a feature_map, no projection;
    decay: gamma per head, the state decays by gamma at every appended token);
    append(k [B, H, T, D], v [B, H, T, Dv]) adds T tokens; query(q [B, H, T, D]) ->
    [B, H, T, Dv] reads the current state, O(m (D + Dv)) per token whatever the position:
    query after appending tokens 0..i equals row i of causal attention. FAVOR++/FAVOR#
    need a fit (calibrated, or a float A for favorpp). state_bytes does not grow with
    position. One decoder is not to be shared by threads (calls are serialised).
    window, sinks (not both 0): hybrid attention's decoder (favor::HybridDecoder): a ring of
    the last `window` tokens, the sinks and the linear state of the tokens that left the
    window; query after tokens 0..i equals row i of attention(..., causal=True, window,
    sinks). Its state is fixed by (window, sinks, m).
    """

    def __init__(self, batch, heads, dv, projection=None, *, kernel="positive", scale=None,
                 fit=None, feature_map=None, feature_weights=None, decay=None, window=0,
                 sinks=0):
        window, sinks = hybrid_sizes(window, sinks)
        if window or sinks:  # hybrid attention: favor::HybridDecoder over the map
            if feature_map is None and not isinstance(projection, _core.Projection):
                raise _core.Error("projection: Decoder needs a favor.Projection (its d sets D) "
                                  "or a feature_map")
            d = projection.d if feature_map is None else None
            fm = _core_map(d, feature_map, feature_weights, decay,
                           dict(DRAW_DEFAULTS, kernel=kernel, scale=scale, fit=fit,
                                **({} if projection is None else dict(projection=projection))),
                           force=True, inputs=(batch, heads))
            self._d = _core.HybridDecoder(batch, heads, dv, fm, window, sinks,
                                          decay=decay_values(decay))
            return
        if feature_map is not None:
            if projection is not None:
                raise _core.Error("projection: the feature_map carries the projection; give one "
                                  "or the other")
            fm = _core_map(None, feature_map, feature_weights, decay,
                           dict(DRAW_DEFAULTS, kernel=kernel, scale=scale, fit=fit),
                           inputs=(batch, heads))
            self._d = _core.Decoder(batch, heads, dv, feature_map=fm, decay=decay_values(decay))
            return
        if not isinstance(projection, _core.Projection):
            raise _core.Error("projection: Decoder needs a favor.Projection (its d sets D) or "
                              "a feature_map")
        if feature_weights is not None or decay is not None:
            fm = _core_map(projection.d, None, feature_weights, decay,
                           dict(DRAW_DEFAULTS, kernel=kernel, scale=scale, fit=fit,
                                projection=projection), inputs=(batch, heads))
            self._d = _core.Decoder(batch, heads, dv, feature_map=fm, decay=decay_values(decay))
            return
        self._d = _core.Decoder(batch, heads, dv, projection, kernel=kernel, scale=scale,
                                fit=fit_for(fit, kernel, projection.d))  # per head: beams reorder

    projection = property(lambda self: getattr(self._d, "projection", None))
    window = property(lambda self: getattr(self._d, "window", 0), doc="hybrid: the window")
    sinks = property(lambda self: getattr(self._d, "sinks", 0), doc="hybrid: the sinks")
    state_bytes = property(lambda self: self._d.state_bytes,
                           doc="bytes of state (S, s, stabilisers): fixed, whatever the position")

    def __repr__(self):
        hybrid = f", window={self.window}, sinks={self.sinks}" if self.window or self.sinks \
            else f", m={self.projection.m}"
        return (f"favor.Decoder(batch={self.batch}, heads={self.heads}, dv={self.dv}"
                f"{hybrid}, position={self.position})")
