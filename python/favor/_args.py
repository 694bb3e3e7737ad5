"""Rules bound from C++ and the argument helpers the numpy API modules share (api,
feature_map, vq, fit, distributed): one place for each, so that no module imports another
for a private helper and the rules the CLI applies are the ones Python applies.

Bound from C++ (favor._core, python/src/bind_rules.cpp): the kernel names and aliases
(favor::kernel_names), which kernels take a fit and how (favor::check_fit_kernel, the rule
behind the CLI's --fit-a), features per row (favor::feature_count). The feature-map file
reader and writer are favor._core.read_map_file / write_map_file (src/io/map_file.hpp),
used by favor.FeatureMap.
"""
import contextlib
import functools
import operator

import numpy as np

from . import _core

# name -> canonical name, for every spelling the C++ parse_kernel accepts
_SPELLINGS = dict(_core.kernel_names())
KERNELS = tuple(dict.fromkeys(_SPELLINGS.values()))  # the canonical names, in C++ order
KERNEL_NAMES = tuple(_SPELLINGS)                      # the canonical names, then the aliases
ALIASES = {name: kernel for name, kernel in _SPELLINGS.items() if name != kernel}
DEFAULT_FEATURES = 256


def kernel_name(kernel, argument="kernel"):
    """The canonical name of `kernel` (a name or an alias); favor.Error naming `argument`
    (the C++ message) otherwise."""
    if not isinstance(kernel, str):
        raise _core.Error(f"{argument}: must be a string, not {type(kernel).__name__}")
    return _core.parse_kernel(kernel, argument)


def data_adapted(kernel):
    """True for favorpp / favorsharp (their parameters come from a KernelFit)."""
    return _core.data_adapted(kernel_name(kernel))


def integer(x):
    """x as an int (Python or numpy integers; not bool), else None."""
    if isinstance(x, bool):
        return None
    try:
        return operator.index(x)
    except TypeError:
        return None


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
    return drawn_projection(projection, m, operator.index(d), norms, check_seed(seed))


def drawn_projection(projection, m, d, norms, seed):
    """Projection.draw(m, d, kind=projection, norms=norms, seed=seed) (cached, _drawn), its
    errors naming `projection`: the kind's name in every attention function and module
    (Projection.draw's own is `kind`)."""
    with argument_named("projection", "kind"):
        return _drawn(projection, m, d, norms, seed)


@contextlib.contextmanager
def argument_named(name, internal):
    """A favor.Error raised inside about argument `internal` (its name in C++ and the numpy
    API) is raised again naming `name`, the argument the caller gave; any other error as it
    was. The rule and its message stay C++'s."""
    try:
        yield
    except _core.Error as e:
        if not str(e).startswith(internal + ":"):
            raise
        raise _core.Error(name + str(e)[len(internal):]) from None


@functools.lru_cache(maxsize=128)
def _drawn(kind, m, d, norms, seed):
    """The drawn projection of (kind, m, d, norms, seed), drawn once: a projection is a
    function of these alone, and a favor.Projection is immutable (its matrix is a read-only
    view), so every call with the same arguments shares it (a draw costs ~1.4 ms at
    m = 256, D = 64; a cache hit ~1 us)."""
    return _core.Projection.draw(m, d, kind=kind, norms=norms, seed=seed)


def check_features(features):
    """features (m) as an int >= 1, else favor.Error naming it."""
    m = integer(features)
    if m is None or m < 1:
        raise _core.Error(f"features: {features!r} must be an integer >= 1")
    return m


def check_seed(seed):
    """seed as an int in [0, 2^64), else favor.Error naming it."""
    s = integer(seed)
    if s is None or not 0 <= s < 2**64:
        raise _core.Error(f"seed: {seed!r} must be an integer in [0, 2^64)")
    return s


def fit_for(fit, kernel, d, inputs=None):
    """A KernelFit, or a float A (FAVOR++ with one A for every head: the CLI's --fit-a),
    checked by the CLI's rule (favor::check_fit_kernel). inputs=(B, H) of the call: a fit
    with one entry per head (H of them, e.g. fitted on calibration data of shape
    [1, H, N, D]) is repeated over the batch to B*H entries."""
    if fit is None:
        return None
    constant = isinstance(fit, (int, float)) and not isinstance(fit, bool)
    _core.check_fit_kernel(kernel_name(kernel), constant)
    if constant:
        return _core.KernelFit.constant(float(fit), d)
    if not isinstance(fit, _core.KernelFit):
        raise _core.Error(f"fit: must be a favor.KernelFit or a float A, not {type(fit).__name__}")
    if inputs is not None and inputs[0] > 1 and fit.heads == inputs[1] > 1:
        b = inputs[0]
        return _core.KernelFit(np.tile(np.asarray(fit.a), (b, 1)),
                               np.tile(np.asarray(fit.basis), (b, 1, 1)))
    return fit


def decay_values(decay):
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


DRAW_DEFAULTS = (("kernel", "positive"), ("features", None), ("projection", "orthogonal"),
                 ("norms", "chi"), ("seed", 0), ("scale", None), ("fit", None))


def check_map_defaults(draw):
    """With a feature_map, the drawing options (dict name -> value: kernel, features,
    projection, norms, seed, scale, fit) must keep their defaults: the map carries them. An
    explicit default value cannot be told from the default and passes."""
    for name, default in DRAW_DEFAULTS:
        value = draw[name]
        if value is not default and not (isinstance(value, (str, int)) and value == default):
            raise _core.Error(f"{name}: the feature_map carries the kernel, projection, scale "
                              "and fit; leave " + ", ".join(n for n, _ in DRAW_DEFAULTS)
                              + " at their defaults")


def batch_heads(x):
    """(B, H) of a 4-D [B, H, N, D] input; (1, 1) for 2-D [N, D]."""
    return (int(x.shape[0]), int(x.shape[1])) if len(x.shape) == 4 else (1, 1)


def head_dim(x, name):
    """D of a 2-D [N, D] or 4-D [B, H, N, D] input named `name`."""
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) not in (2, 4):
        raise _core.Error(f"{name}: must be a 2-D [N, D] or 4-D [B, H, N, D] array")
    return int(shape[-1])


def float_array(x, name):
    """x as a float32 C-order copy (writable, owned); float dtypes only."""
    a = np.asarray(x)
    if a.dtype.kind != "f":
        raise _core.Error(f"{name}: dtype {a.dtype} is not a float type")
    return np.array(a, dtype=np.float32, order="C")


def parameter_sets(x, name, per_set_rank, heads):
    """x as [heads, ...] float32: a parameter without the heads axis is one set."""
    if x is None:
        return None
    a = float_array(x, name)
    if a.ndim == per_set_rank:
        a = a[None]
    if a.ndim != per_set_rank + 1:
        layout = "[heads, m, d] (or [m, d])" if per_set_rank == 2 else "[heads, m] (or [m])"
        raise _core.Error(f"{name}: shape {list(a.shape)} must be {layout}")
    if heads is not None and a.shape[0] != heads:
        raise _core.Error(f"{name}: has {a.shape[0]} sets along axis 0 but heads = {heads}")
    return a


def check_values(a, name, nonzero=False):
    """The C++ check of a parameter's values (finite; nonzero for feature weights), naming
    the caller's argument: `name[i] = x` with i the flat index, as the C++ message."""
    a = np.asarray(a)
    bad = ~np.isfinite(a)
    if nonzero:
        bad |= a == 0
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        what = "feature weights must be finite and nonzero" if nonzero else "not finite"
        raise _core.Error(f"{name}[{i}] = {a.reshape(-1)[i]:g}: {what}")


def check_set_count(sets, name, batch, heads):
    """A parameter with `sets` sets along axis 0 against inputs with `batch` sequences of
    `heads` heads: 1, H or B*H (head (b, h) uses set (b H + h) % sets)."""
    if sets not in (1, heads, batch * heads):
        raise _core.Error(f"{name}: has {sets} parameter sets along axis 0; the inputs need 1, "
                          f"H = {heads} or B*H = {batch * heads}")


def number(value, name):
    """value as a float, converted as favor's bindings convert one (anything with __float__
    but a str); TypeError naming the argument otherwise (float('x') would name nothing)."""
    if isinstance(value, (str, bytes)) or not hasattr(type(value), "__float__"):
        raise TypeError(f"{name}: {value!r:.80} ({type(value).__name__}) is not a number")
    return float(value)


def optional_number(value, name):
    """None, or value as a float (number)."""
    return None if value is None else number(value, name)


def block_length(block):
    """The VQ causal block length: None -> 0 (favor's default), else an integer >= 1."""
    if block is None:
        return 0
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block < 1:
        raise _core.Error(f"block: {block!r} must be None (favor's default) or an integer >= 1")
    return int(block)


def mix_seed(seed, n):
    """The seed of EMA update n: distinct for every (seed, n) pair."""
    return (int(seed) * 0x9E3779B97F4A7C15 + n) % 2**64


class Streaming:
    """What favor.Decoder and favor.VQDecoder share: calls and properties of the _core
    decoder held in self._d."""

    def append(self, k, v, key_mask=None):
        """Adds T tokens; key_mask [B, T] (nonzero = the token takes part) leaves a masked
        token's row as it was: left-padded batches."""
        self._d.append(k, v, key_mask=key_mask)

    def query(self, q):
        return self._d.query(q)

    def step(self, q, k, v, key_mask=None):
        """One decode step of every row in one fused pass: append(k, v, key_mask) then
        query(q), q/k [B, H, 1, D], v [B, H, 1, Dv], key_mask [B, 1] -> [B, H, 1, Dv]."""
        return self._d.step(q, k, v, key_mask=key_mask)

    def prefill(self, q, k, v, key_mask=None):
        """Causal attention over a prompt of T tokens from the current state ->
        [B, H, T, Dv]; leaves the state append(k, v, key_mask) would (key features, or
        codes, computed once)."""
        return self._d.prefill(q, k, v, key_mask=key_mask)

    def reset(self):
        self._d.reset()

    def state(self):
        """A copy of the state as numpy arrays and the int 'position' (Decoder: sums, log_max,
        row_positions; VQDecoder: sums, counts; docs/api.md, "Decoder state");
        load_state(**state) restores it."""
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


def hybrid_sizes(window, sinks, check=False):
    """window and sinks as ints (any integer type, not bool: favor.Error instead of a
    TypeError); with check, also C++'s rule on their values (favor::check_attention_shapes:
    >= 0), for a constructor (a call's values are checked by the call)."""
    out = []
    for value, name in ((window, "window"), (sinks, "sinks")):
        if isinstance(value, bool):
            raise _core.Error(f"{name}: must be an integer (got bool)")
        try:
            out.append(operator.index(value))
        except TypeError:
            raise _core.Error(f"{name}: must be an integer (got {type(value).__name__})") \
                from None
    if check:
        _core.check_attention_shapes([1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], window=out[0],
                                     sinks=out[1])
    return tuple(out)

