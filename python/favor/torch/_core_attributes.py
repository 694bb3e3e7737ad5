"""The public face of a layer that owns a favor.torch.FavorCore as `core` (FavorAttention,
MultiheadAttention): the core's attributes and methods as the layer's, the layer's attention
hooks (_prepare, attend, _learn: MultiHeadModule's and MultiheadAttention's forward call
them) run by the core, and loading a state_dict of the flat layout from before the core.

The core's tensors are in the state_dict as `core.projection`, `core.map_weight`,
`core.map_bias`, `core.map_lambda`, `core.decay_logit`; a state_dict with the flat names
(`projection`, ...) is renamed on loading.
"""
from .favor_core import _TENSORS

_CORE = "core"


def _delegate(name, settable=True):
    """The core's attribute `name` as the layer's. A subclass that owns no core
    (VQMultiheadAttention, whose configuration shares names such as scale, seed and decay)
    keeps a plain attribute of that name instead."""

    def get(self):
        core = self._modules.get(_CORE)
        if core is None:
            try:
                return self.__dict__[name]
            except KeyError:
                raise AttributeError(name) from None
        return getattr(core, name)

    def set(self, value):
        core = self._modules.get(_CORE)
        if core is None:
            self.__dict__[name] = value
        else:
            setattr(core, name, value)

    return property(get, set if settable else None,
                    doc=f"The core's `{name}` (favor.torch.FavorCore.{name}).")


class CoreAttributes:
    """For nn.Modules that set `self.core = FavorCore(...)` in __init__."""

    projection = _delegate("projection")
    map_weight = _delegate("map_weight")
    map_bias = _delegate("map_bias")
    map_lambda = _delegate("map_lambda")
    decay_logit = _delegate("decay_logit")
    decay = _delegate("decay")
    fit = _delegate("fit")
    kernel = _delegate("kernel")
    method = _delegate("method")
    scale = _delegate("scale")
    feature_redraw_interval = _delegate("feature_redraw_interval")
    redraws = _delegate("redraws")
    seed = _delegate("seed")
    norms = _delegate("norms")
    projection_kind = _delegate("projection_kind")
    features = _delegate("features", settable=False)
    gamma = _delegate("gamma", settable=False)
    fit_tensors = _delegate("fit_tensors", settable=False)

    def redraw(self, seed=None):
        """Draws W anew (FavorCore.redraw)."""
        self.core.redraw(seed)

    def fix_projection(self):
        """Stops redrawing W (FavorCore.fix_projection)."""
        self.core.fix_projection()

    def feature_map(self):
        """The current map as a favor.FeatureMap (FavorCore.feature_map)."""
        return self.core.feature_map()

    def decoder(self, batch):
        """A favor.torch.Decoder for generation with step() (FavorCore.decoder)."""
        return self.core.decoder(batch)

    def _prepare(self, k, key_padding_mask):
        self.core.prepare(k, key_padding_mask)

    def attend(self, q, k, v, key_padding_mask=None, causal=None):
        """The attention core on [B, H, N, head_dim] tensors (no in/out projections); causal
        None: the layer's."""
        return self.core.attend(q, k, v, key_padding_mask,
                                self.causal if causal is None else causal)

    def _learn(self, k, key_padding_mask):
        self.core.learn(k, key_padding_mask)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        # Runs before the children load: a flat key of the layout before the core
        # (`projection`, ...) becomes the core's (`core.projection`, ...).
        if _CORE in self._modules:
            for name in _TENSORS:
                old, new = prefix + name, f"{prefix}{_CORE}.{name}"
                if old in state_dict and new not in state_dict:
                    state_dict[new] = state_dict.pop(old)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
