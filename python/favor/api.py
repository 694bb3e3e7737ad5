"""The numpy API: one function per C++ entry point, the CLI's option names.

Shapes: q [B, H, Nq, D], k [B, H, Nk, D], v [B, H, Nk, Dv] -> [B, H, Nq, Dv]; or all 2-D
([N, D], one head) -> 2-D. key_mask: [B, Nk] ([Nk] for 2-D inputs), bool or integer,
nonzero = the key takes part (the CLI's --key-mask; torch's key_padding_mask is the
opposite and is handled in favor.torch).
"""
import functools
import operator
import os
from collections import namedtuple

import numpy as np

from . import _core
from .feature_map import FeatureMap, _check_set_count, _check_values, _sets

DEFAULT_FEATURES = 256
KERNEL_NAMES = ("positive", "trig", "hyperbolic", "favorpp", "favorsharp", "hedgehog", "favor++",
                "favor#")

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


def make_projection(d, projection="orthogonal", *, features=None, norms="chi", seed=0):
    """The projection an attention call uses: `projection` itself if it is a
    favor.Projection (then `features`, if given, must equal its m), else
    Projection.draw(features or 256, d, kind=projection, norms=norms, seed=seed): the same
    bits as the CLI's --projection/--features/--norms/--seed."""
    if isinstance(projection, _core.Projection):
        if features is not None and features != projection.m:
            raise _core.Error(f"features: {features} differs from the given projection's "
                              f"m = {projection.m}")
        if projection.d != d:
            raise _core.Error(f"projection: has d = {projection.d}, the inputs have D = {d}")
        return projection
    if not isinstance(projection, str):
        raise _core.Error("projection: must be a kind (iid, orthogonal, radial, qmc, sorf, "
                          f"simplex, dct) or a favor.Projection, not {type(projection).__name__}")
    m = check_features(DEFAULT_FEATURES if features is None else features)
    s = check_seed(seed)
    try:
        return _drawn(projection, m, operator.index(d), norms, s)
    except _core.Error as e:  # Projection.draw calls the kind `kind`; here it is `projection`
        if str(e).startswith("kind:"):
            raise _core.Error("projection:" + str(e)[len("kind:"):]) from None
        raise


@functools.lru_cache(maxsize=128)
def _drawn(kind, m, d, norms, seed):
    """The drawn projection of (kind, m, d, norms, seed), drawn once: a projection is a
    function of these alone, and a favor.Projection is immutable (its matrix is a read-only
    view), so every call with the same arguments shares it (a draw costs ~1.4 ms at
    m = 256, D = 64; a cache hit ~1 us)."""
    return _core.Projection.draw(m, d, kind=kind, norms=norms, seed=seed)


def check_features(features):
    """features (m) as an int >= 1, else favor.Error naming it."""
    m = _integer(features)
    if m is None or m < 1:
        raise _core.Error(f"features: {features!r} must be an integer >= 1")
    return m


def check_seed(seed):
    """seed as an int in [0, 2^64), else favor.Error naming it."""
    s = _integer(seed)
    if s is None or not 0 <= s < 2**64:
        raise _core.Error(f"seed: {seed!r} must be an integer in [0, 2^64)")
    return s


def _integer(x):
    """x as an int (Python or numpy integers; not bool), else None."""
    if isinstance(x, bool):
        return None
    try:
        return operator.index(x)
    except TypeError:
        return None


def _fit(fit, kernel, d, inputs=None):
    """A KernelFit, or a float A (FAVOR++ with one A for every head: the CLI's --fit-a).
    inputs=(B, H) of the call: a fit with one entry per head (H of them, e.g. fitted on
    calibration data of shape [1, H, N, D]) is repeated over the batch to B*H entries."""
    if fit is None:
        return None
    if kernel in ("positive", "trig", "hyperbolic"):
        raise _core.Error(f"fit: only the favorpp and favorsharp kernels take a fit "
                          f"(kernel is '{kernel}')")
    if isinstance(fit, _core.KernelFit):
        if inputs is not None and inputs[0] > 1 and fit.heads == inputs[1] > 1:
            b = inputs[0]
            return _core.KernelFit(np.tile(np.asarray(fit.a), (b, 1)),
                                   np.tile(np.asarray(fit.basis), (b, 1, 1)))
        return fit
    if isinstance(fit, (int, float)):
        if kernel not in ("favorpp", "favor++"):
            raise _core.Error("fit: one A for every direction is FAVOR++ (kernel='favorpp'); "
                              "favorsharp needs a KernelFit from fit_kernel")
        return _core.KernelFit.constant(float(fit), d)
    raise _core.Error(f"fit: must be a favor.KernelFit or a float A, not {type(fit).__name__}")


def _decay(decay):
    """decay (None, a float or one gamma per head) as a list of floats; [] for none."""
    if decay is None:
        return []
    try:
        a = np.asarray(decay, dtype=np.float64)
    except (TypeError, ValueError):
        raise _core.Error(f"decay: {decay!r} must be a float or a sequence of floats "
                          "(one gamma in (0, 1] per head)") from None
    if a.ndim > 1:
        raise _core.Error(f"decay: shape {list(a.shape)} must be a float or 1-D (one gamma per "
                          "head)")
    return [float(x) for x in a.ravel()]


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
    lam = _sets(feature_weights, "feature_weights", 1, None)
    _check_values(lam, "feature_weights", nonzero=True)
    return lam


_DRAW_DEFAULTS = (("kernel", "positive"), ("features", None), ("projection", "orthogonal"),
                  ("norms", "chi"), ("seed", 0), ("scale", None), ("fit", None))


def _check_map_defaults(draw):
    """With a feature_map, the drawing options (dict name -> value: kernel, features,
    projection, norms, seed, scale, fit) must keep their defaults: the map carries them. An
    explicit default value cannot be told from the default and passes."""
    for name, default in _DRAW_DEFAULTS:
        value = draw[name]
        if value is not default and not (isinstance(value, (str, int)) and value == default):
            raise _core.Error(f"{name}: the feature_map carries the kernel, projection, scale "
                              "and fit; leave " + ", ".join(n for n, _ in _DRAW_DEFAULTS)
                              + " at their defaults")


def _batch_heads(x):
    """(B, H) of a 4-D [B, H, N, D] input; (1, 1) for 2-D [N, D]."""
    return (int(x.shape[0]), int(x.shape[1])) if len(x.shape) == 4 else (1, 1)


def _core_map(d, feature_map, feature_weights, decay, draw, force=False, inputs=None):
    """The favor._core.FeatureMap of a call, or None for the Projection path: feature_map
    itself (a FeatureMap or a path to a saved one; the drawing options `draw` must then keep
    their defaults), or the drawn projection with the kernel, scale, fit and feature_weights
    of the call (when feature_weights or decay is given, or `force`). inputs: (B, H) of the
    call, which the feature_weights' sets are checked against (errors name feature_weights,
    not the map made from them)."""
    if feature_map is not None:
        _check_map_defaults(draw)
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
        return feature_map.core()
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
        if inputs is not None and all(_integer(x) is not None and x >= 1 for x in inputs):
            _check_set_count(lam.shape[0], "feature_weights", *inputs)
    kernel = draw["kernel"]
    ok = inputs is not None and all(_integer(x) is not None for x in inputs)
    fit = _fit(draw["fit"], kernel, d, tuple(inputs) if ok else None)
    return _core.FeatureMap(w, kernel=kernel, scale=draw["scale"], fit=fit,
                            heads=1 if lam is None else lam.shape[0], lambda_=lam)


def _head_dim(x, name):
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) not in (2, 4):
        raise _core.Error(f"{name}: must be a 2-D [N, D] or 4-D [B, H, N, D] array")
    return int(shape[-1])


def attention(q, k, v, *, method="favor", causal=False, kernel="positive", features=None,
              projection="orthogonal", norms="chi", seed=0, scale=None, key_mask=None,
              fit=None, accumulate="f32", full_output=False, codebook=None, tau=0.0, block=None,
              feature_map=None, feature_weights=None, decay=None):
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
    """
    if method != "favor":
        for name, value in (("feature_map", feature_map), ("feature_weights", feature_weights),
                            ("decay", decay)):
            if value is not None:
                raise _core.Error(f"{name}: only method='favor' takes a {name} "
                                  f"(method is '{method}')")
    if codebook is not None and method != "vq":
        raise _core.Error(f"codebook: only method='vq' takes a codebook (method is '{method}')")
    if method == "vq":
        if codebook is None:
            raise _core.Error("codebook: method='vq' needs a codebook ([c, D], [H, c, D] or a "
                              "favor.Codebook)")
        from .vq import vq_attention  # vq imports this module
        y, zero_rows = vq_attention(q, k, v, codebook, causal=causal, scale=scale,
                                    key_mask=key_mask, tau=tau, block=block, full_output=True)
        return AttentionOutput(y, None, zero_rows) if full_output else y
    if method == "exact":
        if kernel not in KERNEL_NAMES:  # the CLI parses --kernel whatever the method
            raise _core.Error(f"kernel: '{kernel}' is not a kernel; use one of "
                              + ", ".join(KERNEL_NAMES[:6]))
        y = _core.exact_attention(q, k, v, causal=causal, scale=scale, key_mask=key_mask,
                                  accumulate=accumulate)
        return AttentionOutput(y, None, 0) if full_output else y
    if method != "favor":
        raise _core.Error(f"method: '{method}' is not a method; use favor, exact or vq")
    d = _head_dim(q, "q")
    draw = dict(kernel=kernel, features=features, projection=projection, norms=norms,
                seed=seed, scale=scale, fit=fit)
    fm = _core_map(d, feature_map, feature_weights, decay, draw, inputs=_batch_heads(q))
    if fm is not None:
        y, zero_rows, context = _core.attention_map(q, k, v, fm, causal=causal, key_mask=key_mask,
                                                    decay=_decay(decay), save_context=full_output)
        return AttentionOutput(y, context, zero_rows) if full_output else y
    w = make_projection(d, projection, features=features, norms=norms, seed=seed)
    y, zero_rows, context = _core.attention(q, k, v, w, kernel=kernel, causal=causal,
                                            scale=scale, key_mask=key_mask,
                                            fit=_fit(fit, kernel, d, _batch_heads(q)),
                                            save_context=full_output)
    return AttentionOutput(y, context, zero_rows) if full_output else y


def exact_attention(q, k, v, *, causal=False, scale=None, key_mask=None, accumulate="f32"):
    """Exact softmax attention, blockwise with an online softmax (never N x N).
    Same shapes as attention(); rows with no visible key are zeros."""
    return _core.exact_attention(q, k, v, causal=causal, scale=scale, key_mask=key_mask,
                                 accumulate=accumulate)


def attention_backward(q, k, v, dy, *, causal=False, kernel="positive", features=None,
                       projection="orthogonal", norms="chi", seed=0, scale=None, key_mask=None,
                       fit=None, projection_grad=False, context=None, feature_map=None,
                       feature_weights=None, decay=None, parameter_grads=False):
    """Gradients of attention() (method='favor') for dy = dL/dy [B, H, Nq, Dv]: returns
    Grads(dq, dk, dv, dw), dw = dL/dW [m, D] when projection_grad, else None. Give the same
    inputs and options as the forward call (feature_map, feature_weights and decay
    included); `context` (from attention(..., full_output=True)) skips recomputing the key
    state and is refused if it came from other inputs. parameter_grads=True returns
    FeatureMapGrads(dq, dk, dv, dw, dbias, dlambda, ddecay): the gradients of the map's
    learned parameters and of the decay as well."""
    if context is not None and not isinstance(context, _core.AttentionContext):
        raise _core.Error(f"context: must be the AttentionContext of attention(..., "
                          f"full_output=True), not {type(context).__name__}")
    d = _head_dim(q, "q")
    draw = dict(kernel=kernel, features=features, projection=projection, norms=norms,
                seed=seed, scale=scale, fit=fit)
    fm = _core_map(d, feature_map, feature_weights, decay, draw, force=parameter_grads,
                   inputs=_batch_heads(q))
    if fm is not None:
        g = _core.attention_map_backward(q, k, v, dy, fm, causal=causal, key_mask=key_mask,
                                         decay=_decay(decay),
                                         parameter_grads=parameter_grads or projection_grad,
                                         context=context)
        if parameter_grads:
            return FeatureMapGrads(*g)
        return Grads(*g[:3], g[3] if projection_grad else None)
    w = make_projection(d, projection, features=features, norms=norms, seed=seed)
    return Grads(*_core.attention_backward(q, k, v, dy, w, kernel=kernel, causal=causal,
                                           scale=scale, key_mask=key_mask,
                                           fit=_fit(fit, kernel, d, _batch_heads(q)),
                                           projection_grad=projection_grad, context=context))


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
    d = _head_dim(x, "x")
    draw = dict(kernel=kernel, features=features, projection=projection, norms=norms,
                seed=seed, scale=scale, fit=fit)
    fm = _core_map(d, feature_map, feature_weights, None, draw, inputs=_batch_heads(x))
    if fm is not None:
        return _core.features_map(x, fm)
    w = make_projection(d, projection, features=features, norms=norms, seed=seed)
    return _core.features(x, w, kernel=kernel, scale=scale, fit=_fit(fit, kernel, d))


def fit_kernel(kernel, q, k, *, scale=None, key_mask=None):
    """FAVOR++ (kernel='favorpp') or FAVOR# ('favorsharp') parameters fitted to q and k,
    one per (batch, head): a favor.KernelFit for attention(fit=...) and Decoder."""
    return _core.fit_kernel(kernel, q, k, scale=scale, key_mask=key_mask)


def kernel_mse(x, y, *, kernel="positive", features=None, projection="orthogonal", norms="chi",
               seed=0, scale=None, fit=None):
    """Mean over all pairs of (phi(x_i).phi(y_j) - exp(scale x_i.y_j))^2, in double, for
    x [Nx, D] and y [Ny, D]. O(Nx Ny F): small problems only."""
    d = _head_dim(x, "x")
    w = make_projection(d, projection, features=features, norms=norms, seed=seed)
    return _core.kernel_mse(x, y, w, kernel=kernel, scale=scale, fit=_fit(fit, kernel, d))


class _Streaming:
    """What Decoder and favor.VQDecoder share: calls and properties of the _core decoder
    held in self._d."""

    def append(self, k, v, key_mask=None):
        """Adds T tokens; key_mask [B, T] (nonzero = the token takes part) leaves a masked
        token's row as it was: left-padded batches."""
        self._d.append(k, v, key_mask=key_mask)

    def query(self, q):
        return self._d.query(q)

    def reset(self):
        self._d.reset()

    def state(self):
        """A copy of the state as numpy arrays: {'sums', 'log_max', 'row_positions',
        'position'} (docs/api.md, "Decoder state"); load_state(**state) restores it."""
        return self._d.state()

    def load_state(self, **state):
        self._d.load_state(**state)

    def select(self, indices):
        """Keeps batch rows indices (in that order; rows may repeat or go): a beam-search
        reorder."""
        self._d.select(list(indices))

    position = property(lambda self: self._d.position, doc="tokens appended so far")
    batch = property(lambda self: self._d.batch)
    heads = property(lambda self: self._d.heads)
    dv = property(lambda self: self._d.dv)


class Decoder(_Streaming):
    """Streaming (autoregressive) FAVOR decoding with a fixed-size state per (batch, head).

    Decoder(batch, heads, dv, projection, kernel='positive', scale=None, fit=None,
    feature_map=None, feature_weights=None, decay=None) (with a feature_map, no projection;
    decay: gamma per head, the state decays by gamma at every appended token);
    append(k [B, H, T, D], v [B, H, T, Dv]) adds T tokens; query(q [B, H, T, D]) ->
    [B, H, T, Dv] reads the current state, O(m (D + Dv)) per token whatever the position:
    query after appending tokens 0..i equals row i of causal attention. FAVOR++/FAVOR#
    need a fit (calibrated, or a float A for favorpp). state_bytes does not grow with
    position. One decoder is not to be shared by threads (calls are serialised).
    """

    def __init__(self, batch, heads, dv, projection=None, *, kernel="positive", scale=None,
                 fit=None, feature_map=None, feature_weights=None, decay=None):
        if feature_map is not None:
            if projection is not None:
                raise _core.Error("projection: the feature_map carries the projection; give one "
                                  "or the other")
            fm = _core_map(None, feature_map, feature_weights, decay,
                           dict(_DRAW_DEFAULTS, kernel=kernel, scale=scale, fit=fit))
            self._d = _core.Decoder(batch, heads, dv, feature_map=fm, decay=_decay(decay))
            return
        if not isinstance(projection, _core.Projection):
            raise _core.Error("projection: Decoder needs a favor.Projection (its d sets D) or "
                              "a feature_map")
        if feature_weights is not None or decay is not None:
            fm = _core_map(projection.d, None, feature_weights, decay,
                           dict(_DRAW_DEFAULTS, kernel=kernel, scale=scale, fit=fit,
                                projection=projection), inputs=(batch, heads))
            self._d = _core.Decoder(batch, heads, dv, feature_map=fm, decay=_decay(decay))
            return
        self._d = _core.Decoder(batch, heads, dv, projection, kernel=kernel, scale=scale,
                                fit=_fit(fit, kernel, projection.d, (batch, heads)))

    projection = property(lambda self: self._d.projection)
    state_bytes = property(lambda self: self._d.state_bytes,
                           doc="bytes of state (S, s, stabilisers): fixed, whatever the position")

    def __repr__(self):
        return (f"favor.Decoder(batch={self.batch}, heads={self.heads}, dv={self.dv}, "
                f"m={self.projection.m}, position={self.position})")
