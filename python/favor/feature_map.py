"""favor.FeatureMap: a feature map as numpy arrays (the kernel, the projection, the scale and
the learned per-head parameters), saved to and loaded from the .npz format that the C++
library and the ``favor`` CLI read (docs/estimators.md).

For head h (set h % heads), x' = sqrt(scale) x and a = W_h x' + b_h (W_h = weights[h] when
set, else the projection; b_h = bias[h], else 0), lambda_h = lambda_[h] (else 1):

    positive    lambda_f m^-1/2 exp(a_f - |x'|^2/2)
    trig        lambda_f m^-1/2 exp(|x'|^2/2) [sin a_f, cos a_f]
    hyperbolic  lambda_f (2m)^-1/2 exp(-|x'|^2/2) [exp(a_f), exp(-a_f)]
    hedgehog    lambda_f [exp(a_f), exp(-a_f)]    (a learned map: no norm factor)

Only lambda_f^2 enters attention (favor weights the keys by it), so its sign does not matter.
favorpp / favorsharp maps take their parameters from a KernelFit (``fit``) and have no learned
ones.
"""
import math
import os

import numpy as np

from . import _core
from ._args import KERNELS, data_adapted, float_array, kernel_name, make_projection
from ._args import parameter_sets as _sets

__all__ = ["FeatureMap", "KERNELS"]


class FeatureMap:
    """A feature map: kernel, projection [m, d], scale, and per-head parameter sets.

    FeatureMap(projection, *, kernel='positive', scale=None, heads=None, weights=None,
               bias=None, lambda_=None, fit=None)

    projection: a favor.Projection or a float [m, d] array (every head's W unless `weights`
    is set). scale: the temperature (None: 1/sqrt(d)). weights [heads, m, d], bias
    [heads, m], lambda_ [heads, m] (the feature weights, nonzero): float arrays or None;
    heads is 1 (shared), H (one set per head) or B*H (one per (batch, head)); None infers it
    from the parameters (1 without any). fit: a favor.KernelFit for favorpp / favorsharp.
    Checked by the C++ library on construction and at every use; bad values raise
    favor.Error (a ValueError) naming the argument.

    Give it to favor.attention / attention_backward / features / Decoder (feature_map=...),
    save it with save(path) and read it back with FeatureMap.load(path). hedgehog() and
    positive() make learnable starting points; favor.fit_features fits one to data.
    """

    def __init__(self, projection, *, kernel="positive", scale=None, heads=None, weights=None,
                 bias=None, lambda_=None, fit=None):
        if isinstance(projection, _core.Projection):
            projection = projection.matrix
        p = float_array(projection, "projection")
        if p.ndim != 2:
            raise _core.Error(f"projection: shape {list(p.shape)} must be [m, d]")
        self.kernel = kernel_name(kernel)
        self.projection = p
        self.scale = None if scale is None else float(scale)
        self.fit = fit
        self.weights = _sets(weights, "weights", 2, heads)
        self.bias = _sets(bias, "bias", 1, heads)
        self.lambda_ = _sets(lambda_, "lambda_", 1, heads)
        given = [a.shape[0] for a in (self.weights, self.bias, self.lambda_) if a is not None]
        if heads is None:
            heads = given[0] if given else 1
        for a, name in ((self.weights, "weights"), (self.bias, "bias"), (self.lambda_, "lambda_")):
            if a is not None and a.shape[0] != heads:
                raise _core.Error(f"{name}: has {a.shape[0]} sets along axis 0 but heads = {heads}")
        self.heads = int(heads)
        self.core()  # the C++ checks (sizes, finite values, nonzero lambda, kernel rules)

    @property
    def m(self):
        """Projection rows."""
        return self.projection.shape[0]

    @property
    def d(self):
        """Head dim D."""
        return self.projection.shape[1]

    @property
    def features(self):
        """Features per row F: 2m for trig, hyperbolic and hedgehog, m for the others."""
        return _core.feature_count(self.kernel, self.m)

    @property
    def resolved_scale(self):
        """The scale in use: `scale`, or 1/sqrt(d)."""
        return 1.0 / math.sqrt(self.d) if self.scale is None else self.scale

    @property
    def learned(self):
        """True when the map has learned parameters (weights, bias or lambda)."""
        return any(a is not None for a in (self.weights, self.bias, self.lambda_))

    def core(self):
        """The favor._core.FeatureMap the C++ calls take (a copy of the arrays)."""
        return _core.FeatureMap(_core.Projection.from_matrix(self.projection), kernel=self.kernel,
                                scale=self.scale, fit=self.fit, heads=self.heads,
                                weights=self.weights, bias=self.bias, lambda_=self.lambda_)

    def copy(self):
        """A deep copy (the arrays copied)."""
        c = lambda a: None if a is None else a.copy()
        return FeatureMap(self.projection.copy(), kernel=self.kernel, scale=self.scale,
                          heads=self.heads, weights=c(self.weights), bias=c(self.bias),
                          lambda_=c(self.lambda_), fit=self.fit)

    # -- starting points ---------------------------------------------------------------

    @classmethod
    def learnable(cls, kernel, m, d, *, heads=1, seed=0, projection="orthogonal", norms="chi",
                  scale=None, weights=True, bias=True, lambda_=True):
        """A map to train: the projection drawn (kind `projection`, m x d, `norms`, `seed`:
        the CLI's draw) and, with `heads` sets each, weights = copies of it, bias = 0 and
        lambda = 1 for those asked for (the C++ FeatureMap::learnable)."""
        if data_adapted(kernel):
            raise _core.Error(f"kernel: {kernel} takes its parameters from its fit; learn a "
                              "positive or hedgehog map instead")
        w = make_projection(d, projection, features=m, norms=norms, seed=seed).matrix
        if not isinstance(heads, int) or heads < 1:
            raise _core.Error(f"heads: {heads!r} must be an integer >= 1")
        m = w.shape[0]
        return cls(w, kernel=kernel, scale=scale, heads=heads,
                   weights=np.repeat(w[None], heads, axis=0) if weights else None,
                   bias=np.zeros((heads, m), np.float32) if bias else None,
                   lambda_=np.ones((heads, m), np.float32) if lambda_ else None)

    @classmethod
    def hedgehog(cls, m, d, *, heads=1, seed=0, projection="orthogonal", norms="chi",
                 scale=None, weights=True, bias=True, lambda_=False):
        """A Hedgehog map [exp(W x' + b), exp(-W x' - b)] to train: W from the drawn
        projection, b = 0 (and lambda = 1 with lambda_=True), `heads` sets."""
        return cls.learnable("hedgehog", m, d, heads=heads, seed=seed, projection=projection,
                             norms=norms, scale=scale, weights=weights, bias=bias,
                             lambda_=lambda_)

    @classmethod
    def positive(cls, m, d, *, heads=1, seed=0, projection="orthogonal", norms="chi",
                 scale=None, weights=False, bias=False, lambda_=True):
        """The FAVOR+ map with learnable parameters: by default the feature weights lambda
        alone (WPFF: lambda = 1, the drawn projection kept), `heads` sets."""
        return cls.learnable("positive", m, d, heads=heads, seed=seed, projection=projection,
                             norms=norms, scale=scale, weights=weights, bias=bias,
                             lambda_=lambda_)

    # -- the .npz file -----------------------------------------------------------------

    def save(self, path):
        """Writes the map as .npz with the C++ writer the CLI uses (src/io/map_file.hpp;
        '.npz' is added to a path without it, as np.savez does): kernel (0-d '<U16'), scale
        (0-d float64, the scale in use), projection (float32 [m, d]), heads (0-d int64) and,
        when set, weights (float32 [heads, m, d]), bias and lambda (float32 [heads, m]).
        FAVOR++ / FAVOR# maps cannot be saved (their fit is not part of the format).
        Returns the path written."""
        path = os.fspath(path)
        if not path.endswith(".npz"):
            path += ".npz"
        _core.write_map_file(path, self.core())
        return path

    @classmethod
    def load(cls, path, *, projection=None, kernel="positive", scale=None):
        """Reads a map written by save() or by the C++ library / CLI (.npz, stored or
        deflated) with the CLI's reader (src/io/map_file.hpp: malformed files raise
        favor.Error naming the file and the member; members other than the format's are
        ignored). A bare .npy of float [m] or [heads, m] is the feature weights lambda
        alone: give the projection (a favor.Projection or an [m, d] array), kernel and scale
        it goes with."""
        path = os.fspath(path)
        if _is_npy(path):
            try:
                lam = np.load(path, allow_pickle=False)
            except (OSError, ValueError) as e:
                raise _core.Error(f"path: cannot read '{path}' as .npy ({e})") from None
            if projection is None:
                raise _core.Error(f"projection: '{path}' holds feature weights (lambda) alone; "
                                  "give the projection (and kernel, scale) they belong to")
            return cls(projection, kernel=kernel, scale=scale,
                       lambda_=_sets(lam, "lambda", 1, None))
        if projection is not None or kernel != "positive" or scale is not None:
            raise _core.Error(f"projection: '{path}' is a whole map (.npz); projection, "
                              "kernel and scale come from the file")
        m = _core.read_map_file(path)
        return cls(m.projection.matrix, kernel=m.kernel, scale=m.scale, heads=m.heads,
                   weights=m.weights, bias=m.bias, lambda_=m.lambda_)

    def __repr__(self):
        parts = [f"kernel='{self.kernel}'", f"m={self.m}", f"d={self.d}", f"heads={self.heads}"]
        if self.scale is not None:
            parts.append(f"scale={self.scale:g}")
        parts += [n for n, a in (("weights", self.weights), ("bias", self.bias),
                                 ("lambda", self.lambda_)) if a is not None]
        return "favor.FeatureMap(" + ", ".join(parts) + ")"


def _is_npy(path):
    """True when the file at `path` starts as a .npy file does (else it is read as a map
    .npz, whose reader says what is wrong with it)."""
    try:
        with open(path, "rb") as f:
            return f.read(6) == b"\x93NUMPY"
    except OSError:
        return False
