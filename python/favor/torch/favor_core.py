"""favor.torch.FavorCore: the FAVOR attention core of a multi-head layer, on [B, H, N,
head_dim] tensors, with everything it holds: the projection and its redraw policy, the
learned feature map and decay, the kernel, method, scale and fit.

favor's layers own one as `core` (FavorAttention, MultiheadAttention: favor/torch/
_core_attributes.py) after their q/k/v projections; any other attention class can do the
same after its own projections and rotary embeddings (a Hugging Face attention class):

    core = FavorCore(num_heads=8, head_dim=64, causal=True, features=256)
    y = core(q, k, v, key_padding_mask=pad)    # q [B, H, Nq, 64], k, v [B, H, Nk, 64]

Tensors (H = num_heads, m = features, D = head_dim; in the state_dict under the owner's
prefix, e.g. `core.projection`):
- projection [m, D]: the drawn W shared by the heads, a buffer (a Parameter with
  learn_projection=True, trained through dL/dW). feature_redraw_interval = n redraws it
  before every n-th training-mode call (the Performer's policy; None: never); draw i uses
  seed + i, so a run is reproducible.
- map_weight [H, m, D], map_bias [H, m] (learn_features=True; from the drawn projection and
  0, or from the favor.FeatureMap given as feature_init), map_lambda [H, m]
  (feature_weights=True; from 1): the learned feature map.
- decay_logit [H or 1] (learn_decay=True): the decay gamma = sigmoid(decay_logit), kept in
  (0, 1) by the parameterisation whatever the optimiser does; initialised from `decay` (a
  gamma of exactly 1 starts at 1 - 1e-6, the largest the logit reaches in float32). A decay
  that is not learned is the plain list `decay` (configuration, not state). The decay weighs
  causal calls only: a non-causal call runs without it (favor.torch.attention refuses it).
- fit_a [heads, d], fit_basis [heads, d, d] (float64 buffers, only while a FAVOR++ / FAVOR#
  fit is set): the fit's arrays, so a saved state_dict keeps the fit and loading one sets it.
All but the fit train end to end through favor's backward (favor.torch.attention with
weights, bias, feature_weights and a decay tensor). A state_dict without them (torch's
nn.MultiheadAttention, a Hugging Face checkpoint) loads and keeps the initial ones.
"""
import numpy as np
import torch
from torch import nn

from .. import _core
from .._args import decay_values, drawn_projection, fit_for, hybrid_sizes
from ..feature_map import FeatureMap
from . import _tensors as T
from ._attention_core import AttentionCore
from .decoder import Decoder
from .hybrid_decoder import HybridDecoder
from .function import attention

_TENSORS = ("projection", "map_weight", "map_bias", "map_lambda", "decay_logit", "gate_log",
            "fit_a", "fit_basis")
GATE_START = 1e-3  # gate=True: the estimate's starting weight beside the window and sinks
_GAMMA_MAX = 1.0 - 1e-6


def draw(m, d, projection, norms, seed):
    """The [m, d] matrix of favor.Projection.draw(m, d, kind=projection, norms, seed), its
    errors naming `projection`."""
    return torch.from_numpy(drawn_projection(projection, m, d, norms, seed).matrix.copy())


class FavorCore(AttentionCore):
    """FAVOR (or exact) attention on [B, H, N, head_dim] tensors, without in/out projections.

    FavorCore(num_heads, head_dim, *, causal=False, kernel='positive', features=256,
              projection='orthogonal', norms='chi', seed=0, feature_redraw_interval=None,
              learn_projection=False, method='favor', scale=None, fit=None,
              learn_features=False, feature_weights=False, decay=None, learn_decay=False,
              feature_init='projection', device=None, dtype=None, backend=None, window=0,
              sinks=0, gate=None, save_causal_states=False)

    forward(q [B, H, Nq, D], k [B, H, Nk, D], v [B, H, Nk, Dv], key_padding_mask=None
    [B, Nk] (True = ignore), causal=None (None: the core's `causal`)) -> [B, H, Nq, Dv]:
    prepare(k, key_padding_mask) (the redraw policy), attend(...) (favor.torch.attention
    with this core's projection, kernel, scale, fit, map and decay), learn(...) (nothing to
    learn outside the backward). A layer calls the three itself, from its own hooks.
    method='exact' runs favor's exact softmax attention instead (no map, no decay).
    redraw(seed=None) draws W now; fix_projection() stops redrawing. feature_map(): the
    current map as a favor.FeatureMap. decoder(batch): a favor.torch.Decoder for generation.
    `fit`: the FAVOR++ / FAVOR# KernelFit (or a float A), kept as tensors for the op.
    window, sinks: hybrid attention (favor.torch.attention's; configuration, not state):
    exact softmax on the last `window` keys and the first `sinks`, the estimator beyond.
    gate (hybrid only): a learned weight g per head on the estimated terms, under the one
    normaliser: (window and sink terms + g * estimated terms) / (their masses + g * the
    estimated mass). gate=True starts at g = GATE_START (1e-3: the window and sinks' output
    to within that weight of the estimate), a float in (0, 1] at that g. Kept as
    gate_log [H] = log g (g > 0 whatever the optimiser does) and entering the estimator as a
    feature weight (lambda^2 times g), so every kernel with feature weights takes it. Adam
    moves gate_log by about its lr a step: from 1e-3 to 1 is 7 in log g, so train it with a
    larger step than the map's (distill's gate_lr). gate_open = True runs with g = 1
    (attention transfer fits the estimator so).
    save_causal_states (also an attribute; favor.torch.attention's): causal (and hybrid)
    calls under autograd on the CPU keep each 32-token chunk's state and row sums for the
    backward, which is then one reverse sweep instead of a rerun of the forward (a hybrid
    layer's forward + backward 15-30% shorter), for N (m / 32 + 1) (Dv + 1) floats per head
    held until the backward (a bidirectional hybrid: both its estimated parts', about
    twice). Off by default, and favor.hf's training loops leave it off: over a whole model's
    layers it paid only with an allocator that keeps its pages (docs/performance.md, "Saved
    causal states in training").
    """

    TENSORS = _TENSORS

    def __init__(self, num_heads, head_dim, *, causal=False, kernel="positive", features=256,
                 projection="orthogonal", norms="chi", seed=0, feature_redraw_interval=None,
                 learn_projection=False, method="favor", scale=None, fit=None,
                 learn_features=False, feature_weights=False, decay=None, learn_decay=False,
                 feature_init="projection", device=None, dtype=None, backend=None, window=0,
                 sinks=0, gate=None, save_causal_states=False):
        super().__init__()
        check_method(method, learn_features, feature_weights, decay)
        window, sinks = hybrid_sizes(window, sinks, check=True)
        if method == "exact" and (window or sinks):
            raise _core.Error("window, sinks: hybrid attention is method='favor' (or 'window': "
                              "the window alone); method is 'exact'")
        if method == "window" and not (window or sinks):
            raise _core.Error("window, sinks: method='window' attends to the window and the "
                              "sinks only; give window > 0 or sinks > 0")
        self.window, self.sinks = window, sinks
        if not isinstance(save_causal_states, bool):
            raise _core.Error(f"save_causal_states: {save_causal_states!r} must be True or False")
        self.save_causal_states = save_causal_states
        self.backend = T.check_backend(backend)
        self.num_heads, self.head_dim, self.causal = num_heads, head_dim, causal
        self.kernel, self.method, self.scale = kernel, method, scale
        fit = fit_for(fit, kernel, head_dim)
        self.register_buffer("fit_a", None)  # the fit's tensors (fit.setter), when it has one
        self.register_buffer("fit_basis", None)
        self._init_projection(features, projection, norms, seed, learn_projection,
                              feature_redraw_interval, device, dtype)
        self._init_feature_map(learn_features, feature_weights, decay, learn_decay,
                               feature_init, learn_projection, device, dtype)
        self._init_gate(gate, device, dtype)
        self.fit = fit

    # ------------------------------------------------------------------ construction

    def _init_projection(self, features, kind, norms, seed, learn, feature_redraw_interval,
                         device, dtype):
        if not isinstance(features, int) or features < 1:
            raise _core.Error(f"features: {features!r} must be an integer >= 1")
        if feature_redraw_interval is not None and (
                not isinstance(feature_redraw_interval, int) or feature_redraw_interval < 1):
            raise _core.Error(f"feature_redraw_interval: {feature_redraw_interval!r} must be "
                              "None or an integer >= 1")
        if learn and feature_redraw_interval is not None:
            raise _core.Error("feature_redraw_interval: a learned projection is not redrawn; "
                              "give one or the other")
        self.projection_kind, self.norms, self.seed = kind, norms, seed
        self.feature_redraw_interval = feature_redraw_interval
        self.redraws = 0
        self._calls = 0
        w = draw(features, self.head_dim, kind, norms, seed).to(device=device,
                                                                dtype=dtype or torch.float32)
        if learn:
            self.projection = nn.Parameter(w)
        else:
            self.register_buffer("projection", w)

    def _init_feature_map(self, learn_features, feature_weights, decay, learn_decay,
                          feature_init, learn_projection, device, dtype):
        if (learn_features or feature_weights) and self.kernel in ("favorpp", "favorsharp",
                                                                   "favor++", "favor#"):
            raise _core.Error(f"kernel: {self.kernel} takes its parameters from its fit; "
                              "learn_features and feature_weights need a positive, trig, "
                              "hyperbolic or hedgehog map")
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
            self.map_weight = nn.Parameter(w.to(**f).expand(heads, -1, -1).clone())
            b = init.bias if init is not None and init.bias is not None else np.zeros((1, m))
            self.map_bias = nn.Parameter(torch.from_numpy(np.asarray(b)).to(**f)
                                         .expand(heads, -1).clone())
        else:
            self.register_parameter("map_weight", None)
            self.register_parameter("map_bias", None)
        if feature_weights:
            lam = init.lambda_ if init is not None and init.lambda_ is not None else np.ones((1, m))
            self.map_lambda = nn.Parameter(torch.from_numpy(np.asarray(lam)).to(**f)
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
            self.decay_logit = nn.Parameter((torch.log(g) - torch.log1p(-g)).to(**f))
            self.decay = None
        else:
            self.register_parameter("decay_logit", None)
            self.decay = gammas

    def _init_gate(self, gate, device, dtype):
        self.gate_open = False
        if gate is None or gate is False:
            self.register_parameter("gate_log", None)
            return
        start = GATE_START if gate is True else gate
        if isinstance(start, bool) or not isinstance(start, (int, float)) or not 0 < start <= 1:
            raise _core.Error(f"gate: {gate!r} must be True or a starting weight in (0, 1]")
        if self.method != "favor" or not (self.window or self.sinks):
            raise _core.Error("gate: weighs the estimate beside the window and sinks; give "
                              "window or sinks (method 'favor')")
        if self.kernel in ("favorpp", "favorsharp", "favor++", "favor#"):
            raise _core.Error(f"gate: enters as a feature weight, which kernel {self.kernel} "
                              "does not take (its parameters come from its fit)")
        if self.feature_redraw_interval is not None:
            raise _core.Error("feature_redraw_interval: a gated hybrid's map is not redrawn; "
                              "give one or the other")
        self.gate_log = nn.Parameter(torch.full((self.num_heads,), float(np.log(start)),
                                                device=device, dtype=dtype or torch.float32))

    @property
    def gate(self):
        """The gate g per head (a tensor; 1 while gate_open), or None without a gate."""
        if self.gate_log is None:
            return None
        return torch.ones_like(self.gate_log) if self.gate_open else self.gate_log.exp()

    def _lambda(self):
        """The feature weights the op takes: map_lambda, times sqrt(g) per head when gated
        (lambda^2 enters the estimate)."""
        if self.gate_log is None or self.gate_open:
            return self.map_lambda
        half = (0.5 * self.gate_log)[:, None].exp()
        base = self.map_lambda if self.map_lambda is not None else \
            torch.ones(self.num_heads, self.features, device=half.device, dtype=half.dtype)
        return base * half

    def _feature_init(self, init):
        """The favor.FeatureMap given as feature_init (checked against this core, its
        projection copied into W), or None for 'projection' (the drawn W, bias 0, lambda 1)."""
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

    # ------------------------------------------------------------------ attention

    def forward(self, q, k, v, key_padding_mask=None, causal=None):
        self.prepare(k, key_padding_mask)
        y = self.attend(q, k, v, key_padding_mask, causal)
        self.learn(k, key_padding_mask)
        return y

    def prepare(self, k, key_padding_mask=None):
        """Before attend(), with the keys [B, H, Nk, D]: the redraw policy (every
        feature_redraw_interval-th training-mode call draws W anew)."""
        if self.training and self.feature_redraw_interval:
            if self._calls > 0 and self._calls % self.feature_redraw_interval == 0:
                self.redraw()
            self._calls += 1

    def attend(self, q, k, v, key_padding_mask=None, causal=None):
        """favor.torch.attention on [B, H, N, D] tensors with this core's configuration."""
        causal = self.causal if causal is None else causal
        extra = self._map_arguments(causal) if self._uses_map() else {}
        if self.method != "exact" and (self.window or self.sinks):
            extra.update(window=self.window, sinks=self.sinks)
        if self.method == "favor" and self.save_causal_states:
            extra.update(save_causal_states=True)
        return attention(q, k, v, causal=causal, kernel=self.kernel, projection=self.projection,
                         scale=self.scale, key_padding_mask=key_padding_mask,
                         fit=self.fit_tensors, method=self.method, backend=self.backend,
                         **extra)

    def learn(self, k, key_padding_mask=None):
        """After attend(): nothing (the map and W learn through the backward)."""

    def _uses_map(self):
        return (self.map_weight is not None or self.map_lambda is not None
                or self.decay_logit is not None or self.decay is not None
                or (self.gate_log is not None and not self.gate_open))

    def _map_arguments(self, causal):
        """The keywords of favor.torch.attention for the map and, on a causal call, the
        decay: gamma^(i - j) weighs causal attention only, so a non-causal call (a
        MultiheadAttention's cross-attention or unmasked self-attention) runs without it."""
        return dict(weights=self.map_weight, bias=self.map_bias,
                    feature_weights=self._lambda(), decay=self.gamma if causal else None)

    # ------------------------------------------------------------------ projection

    @property
    def features(self):
        return self.projection.shape[0]

    @torch.no_grad()
    def redraw(self, seed=None):
        """Draws W anew (seed, or the next seed of this core's sequence) in place."""
        if seed is None:
            self.redraws += 1
            seed = self.seed + self.redraws
        w = draw(self.projection.shape[0], self.projection.shape[1], self.projection_kind,
                 self.norms, seed)
        self.projection.copy_(w)

    def fix_projection(self):
        """Stops redrawing: W stays as it is from now on (for fine-tuning and inference)."""
        self.feature_redraw_interval = None

    # ------------------------------------------------------------------ map, fit, decay

    @property
    def fit(self):
        """The FAVOR++ / FAVOR# fit (a favor.KernelFit) or None; setting it also keeps its
        arrays as the float64 buffers fit_a [heads, d] and fit_basis [heads, d, d], which
        the op takes (so a compiled forward never reads the C++ object) and which the
        state_dict holds: loading a state_dict with them sets the fit."""
        return self.__dict__.get("_kernel_fit")

    @fit.setter
    def fit(self, value):
        self.__dict__["_kernel_fit"] = value
        device = self.projection.device
        tensor = lambda x: torch.tensor(np.array(x, dtype=np.float64), device=device)
        self.fit_a = None if value is None else tensor(value.a)
        self.fit_basis = None if value is None else tensor(value.basis)

    @property
    def fit_tensors(self):
        """(a [heads, d], basis [heads, d, d]) float64 of the fit, or None."""
        return None if self.fit_a is None else (self.fit_a, self.fit_basis)

    def _apply(self, fn, recurse=True):
        # .to(device) moves the fit's buffers; a dtype cast (.half(), .to(torch.bfloat16))
        # leaves them float64, as the fit is.
        pair = self.fit_tensors
        out = super()._apply(fn, recurse)
        if pair is not None:
            self.fit_a = pair[0].to(self.fit_a.device, torch.float64)
            self.fit_basis = pair[1].to(self.fit_basis.device, torch.float64)
        return out

    @property
    def gamma(self):
        """The decay gamma per head (a tensor when learned), a list, or None."""
        if self.decay_logit is not None:
            return torch.sigmoid(self.decay_logit)
        return self.decay

    @torch.no_grad()
    def feature_map(self):
        """The current map as a favor.FeatureMap (numpy copies): save() it, give it to
        favor.attention, or to another module as feature_init."""
        arr = lambda t: None if t is None else t.detach().to(torch.float32).cpu().numpy().copy()
        lam = self._lambda()
        learned = self.map_weight is not None or lam is not None
        return FeatureMap(arr(self.projection), kernel=self.kernel, scale=self.scale,
                          heads=self.num_heads if learned else None,
                          weights=arr(self.map_weight), bias=arr(self.map_bias),
                          lambda_=arr(lam), fit=self.fit)

    def decoder(self, batch):
        """A streaming state for generation: favor.torch.Decoder over this core's heads,
        projection (or learned map and decay), kernel, scale and fit (with a window or sinks,
        a favor.torch.HybridDecoder)."""
        if self.method == "exact":
            raise _core.Error("decoder: method='exact' has no fixed-size state; use favor")
        make, hybrid = Decoder, {}
        if self.window or self.sinks:  # the ring of the window, the sinks, the linear state
            make, hybrid = HybridDecoder, dict(window=self.window, sinks=self.sinks,
                                               estimate=self.method == "favor")
        if self._uses_map():
            gamma = self.gamma
            if isinstance(gamma, torch.Tensor):
                gamma = [float(g) for g in gamma.detach()]
            return make(batch, self.num_heads, self.head_dim, feature_map=self.feature_map(),
                        decay=gamma, backend=self.backend, **hybrid)
        return make(batch, self.num_heads, self.head_dim, self.projection,
                    kernel=self.kernel, scale=self.scale, fit=self.fit, backend=self.backend,
                    **hybrid)

    # ------------------------------------------------------------------ state_dict

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        # A state_dict with a fit (fit_a, fit_basis) sets it first, so the buffers have its
        # shape whether or not this core had one; one without keeps this core's.
        a, basis = state_dict.get(prefix + "fit_a"), state_dict.get(prefix + "fit_basis")
        if a is not None and basis is not None:
            self.fit = _core.KernelFit(a.detach().cpu().to(torch.float64).numpy(),
                                       basis.detach().cpu().to(torch.float64).numpy())
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    def extra_repr(self):
        return (f"num_heads={self.num_heads}, head_dim={self.head_dim}, causal={self.causal}, "
                f"kernel={self.kernel}, features={self.features}, "
                f"projection={self.projection_kind}, method={self.method}" + describe(self)
                + (f", window={self.window}, sinks={self.sinks}"
                   if self.window or self.sinks else ""))


def check_method(method, learn_features, feature_weights, decay):
    """FAVOR, exact or window (hybrid attention's window and sinks alone); exact and window
    take no feature map or decay."""
    if method not in ("favor", "exact", "window"):
        raise _core.Error(f"method: '{method}' is not a method; use favor, exact or window")
    if method != "favor" and (learn_features or feature_weights or decay is not None):
        raise _core.Error(f"method: '{method}' has no feature map; learn_features, "
                          "feature_weights and decay need method='favor'")


def describe(core):
    """The extra_repr part of a core's map and decay."""
    parts = []
    if core.map_weight is not None:
        parts.append("learn_features=True")
    if core.map_lambda is not None:
        parts.append("feature_weights=True")
    if core.decay_logit is not None:
        parts.append("learn_decay=True")
    elif core.decay is not None:
        parts.append(f"decay={core.decay}")
    if getattr(core, "gate_log", None) is not None:
        parts.append("gate=True")
    return "".join(", " + p for p in parts)
