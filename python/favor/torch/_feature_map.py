"""The learned feature map and decay that favor's FAVOR modules carry as parameters
(FavorAttention, MultiheadAttention), and the favor.FeatureMap of their current values.

Parameters (per head h of H, m = features, head_dim = D):
- map_weight [H, m, D]: per-head projections W_h (learn_features=True; initialised from the
  module's drawn projection, or from a favor.FeatureMap given as feature_init);
- map_bias [H, m]: biases b_h (learn_features=True; initialised to 0, or from the map);
- map_lambda [H, m]: feature weights lambda_h (feature_weights=True; initialised to 1);
- decay_logit [H or 1] (learn_decay=True): the decay gamma = sigmoid(decay_logit), kept in
  (0, 1) by the parameterisation whatever the optimiser does; initialised from `decay` (a
  gamma of exactly 1 starts at 1 - 1e-6, the largest the logit reaches in float32). A decay
  that is not learned is the plain list `decay` (configuration, not state). The decay
  weighs causal calls only (favor.torch.attention refuses it on a non-causal one):
  _map_arguments leaves it out of the others.
All train end to end through favor's backward (favor.torch.attention with weights, bias,
feature_weights and a decay tensor).
"""
import numpy as np
import torch

from .. import _core
from .._args import decay_values
from ..feature_map import FeatureMap

_PARAMETERS = ("map_weight", "map_bias", "map_lambda", "decay_logit")
_GAMMA_MAX = 1.0 - 1e-6


class FeatureMapMixin:
    """For FAVOR modules with ProjectionMixin's `projection`, num_heads and head_dim."""

    def _init_feature_map(self, kernel, learn_features, feature_weights, decay, learn_decay,
                          feature_init, learn_projection, device=None, dtype=None):
        if (learn_features or feature_weights) and kernel in ("favorpp", "favorsharp",
                                                              "favor++", "favor#"):
            raise _core.Error(f"kernel: {kernel} takes its parameters from its fit; learn_features"
                              " and feature_weights need a positive, trig, hyperbolic or hedgehog "
                              "map")
        if (learn_features or feature_weights) and self.feature_redraw_interval is not None:
            raise _core.Error("feature_redraw_interval: a learned feature map is not redrawn; "
                              "give one or the other")
        if learn_features and learn_projection:
            raise _core.Error("learn_projection: learn_features learns per-head projections "
                              "already; give one or the other")
        if learn_decay and decay is None:
            raise _core.Error("learn_decay: needs a starting decay (decay=gamma or a list)")
        init = self._feature_init(feature_init)
        f = dict(device=device, dtype=dtype or torch.float32)
        heads, m = self.num_heads, self.features
        if learn_features:
            w = init.weights if init is not None and init.weights is not None else None
            w = self.projection.detach()[None] if w is None else torch.from_numpy(w)
            self.map_weight = torch.nn.Parameter(w.to(**f).expand(heads, -1, -1).clone())
            b = init.bias if init is not None and init.bias is not None else np.zeros((1, m))
            self.map_bias = torch.nn.Parameter(torch.from_numpy(np.asarray(b)).to(**f)
                                               .expand(heads, -1).clone())
        else:
            self.register_parameter("map_weight", None)
            self.register_parameter("map_bias", None)
        if feature_weights:
            lam = init.lambda_ if init is not None and init.lambda_ is not None else np.ones((1, m))
            self.map_lambda = torch.nn.Parameter(torch.from_numpy(np.asarray(lam)).to(**f)
                                                 .expand(heads, -1).clone())
        else:
            self.register_parameter("map_lambda", None)
        gammas = decay_values(decay) if decay is not None else None
        if gammas is not None and len(gammas) not in (1, heads):
            raise _core.Error(f"decay: has {len(gammas)} values; give 1 or one per head ({heads})")
        if gammas is not None and not all(0.0 < g <= 1.0 for g in gammas):
            raise _core.Error(f"decay: {gammas} must lie in (0, 1]")
        if learn_decay:
            g = torch.tensor([min(x, _GAMMA_MAX) for x in gammas], dtype=torch.float64)
            self.decay_logit = torch.nn.Parameter((torch.log(g) - torch.log1p(-g)).to(**f))
            self.decay = None
        else:
            self.register_parameter("decay_logit", None)
            self.decay = gammas

    def _feature_init(self, init):
        """The favor.FeatureMap given as feature_init (checked against this module), or None
        for 'projection' (the drawn projection, bias 0, lambda 1)."""
        if init is None or (isinstance(init, str) and init == "projection"):
            return None
        if not isinstance(init, FeatureMap):
            raise _core.Error(f"feature_init: {init!r} must be 'projection' or a favor.FeatureMap")
        if init.m != self.features or init.d != self.head_dim:
            raise _core.Error(f"feature_init: the map is {init.m} x {init.d}; this module has "
                              f"features = {self.features}, head_dim = {self.head_dim}")
        if init.heads not in (1, self.num_heads):
            raise _core.Error(f"feature_init: heads = {init.heads} must be 1 or num_heads = "
                              f"{self.num_heads}")
        if init.kernel != self.kernel:
            raise _core.Error(f"feature_init: a {init.kernel} map for a {self.kernel} module")
        with torch.no_grad():
            self.projection.copy_(torch.from_numpy(init.projection))
        return init

    @property
    def fit(self):
        """The FAVOR++ / FAVOR# fit (a favor.KernelFit) or None; setting it also keeps its
        arrays as tensors, which the op takes (so a compiled forward never reads the C++
        object)."""
        return self.__dict__.get("_kernel_fit")

    @fit.setter
    def fit(self, value):
        self.__dict__["_kernel_fit"] = value
        self.__dict__["_fit_pair"] = None if value is None else (
            torch.from_numpy(np.asarray(value.a)), torch.from_numpy(np.asarray(value.basis)))

    @property
    def fit_tensors(self):
        """(a [heads, d], basis [heads, d, d]) float64 of the fit, or None."""
        return self.__dict__.get("_fit_pair")

    @property
    def gamma(self):
        """The decay gamma per head (a tensor when learned), a list, or None."""
        if self.decay_logit is not None:
            return torch.sigmoid(self.decay_logit)
        return self.decay

    def _uses_map(self):
        return (self.map_weight is not None or self.map_lambda is not None
                or self.decay_logit is not None or self.decay is not None)

    def _map_arguments(self, causal):
        """The keywords of favor.torch.attention for this module's map and, on a causal call,
        its decay: gamma^(i - j) weighs causal attention only, so a non-causal call (a
        MultiheadAttention's cross-attention or unmasked self-attention) runs without it."""
        return dict(weights=self.map_weight, bias=self.map_bias,
                    feature_weights=self.map_lambda, decay=self.gamma if causal else None)

    @torch.no_grad()
    def feature_map(self):
        """The current map as a favor.FeatureMap (numpy copies): save() it, give it to
        favor.attention, or to another module as feature_init."""
        arr = lambda t: None if t is None else t.detach().to(torch.float32).cpu().numpy().copy()
        return FeatureMap(arr(self.projection), kernel=self.kernel, scale=self.scale,
                          heads=self.num_heads if self._learned() else None,
                          weights=arr(self.map_weight), bias=arr(self.map_bias),
                          lambda_=arr(self.map_lambda))

    def _learned(self):
        return self.map_weight is not None or self.map_lambda is not None

    def _decoder_map(self):
        """(feature_map, decay) for a Decoder; (None, None) without a map or decay."""
        if not self._uses_map():
            return None, None
        gamma = self.gamma
        if isinstance(gamma, torch.Tensor):
            gamma = [float(g) for g in gamma.detach()]
        return self.feature_map(), gamma

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        # A state_dict from torch's nn.MultiheadAttention (favor.torch.convert) has no map:
        # keep the initial one.
        for name in _PARAMETERS:
            if prefix + name in missing_keys:
                missing_keys.remove(prefix + name)


def check_method(method, learn_features, feature_weights, decay):
    """FAVOR or exact; exact takes no feature map or decay."""
    if method not in ("favor", "exact"):
        raise _core.Error(f"method: '{method}' is not a method; use favor or exact")
    if method == "exact" and (learn_features or feature_weights or decay is not None):
        raise _core.Error("method: 'exact' has no feature map; learn_features, feature_weights "
                          "and decay need method='favor'")


def describe(module):
    """The extra_repr part of a module's map and decay."""
    parts = []
    if module.map_weight is not None:
        parts.append("learn_features=True")
    if module.map_lambda is not None:
        parts.append("feature_weights=True")
    if module.decay_logit is not None:
        parts.append("learn_decay=True")
    elif module.decay is not None:
        parts.append(f"decay={module.decay}")
    return "".join(", " + p for p in parts)

