"""The public face of a layer that owns an attention core as `core`: the core's attributes
and methods as the layer's, the layer's attention hooks (_prepare, attend, _learn:
MultiHeadModule's and TorchMultihead's forward call them) run by the core, and loading a
state_dict of the flat layout from before the core.

CoreAttributes holds what every core has (the hooks, decoder(), scale, seed, decay, method,
the state_dict renaming); FavorAttributes adds a favor.torch.FavorCore's (FavorAttention,
MultiheadAttention), VQAttributes a favor.torch.VQCore's (VQAttention, VQMultiheadAttention).

The core's tensors are in the state_dict as `core.<name>` for each name of its TENSORS
(FavorCore: projection, map_weight, map_bias, map_lambda, decay_logit; VQCore: codebook,
ema_sum, ema_count, unused, initialised, updates); a state_dict with the flat names
(`projection`, `codebook`, ...) is renamed on loading.
"""
_CORE = "core"


def _delegate(name, settable=True):
    """The core's attribute `name` as the layer's."""

    def core(self):
        core = self._modules.get(_CORE)
        if core is None:  # before __init__ has set it
            raise AttributeError(name)
        return core

    def get(self):
        return getattr(core(self), name)

    def set(self, value):
        setattr(core(self), name, value)

    return property(get, set if settable else None, doc=f"The core's `{name}`.")


class CoreAttributes:
    """For nn.Modules that set `self.core = <a core>` in __init__ (through a subclass below)."""

    decay = _delegate("decay")
    method = _delegate("method")
    scale = _delegate("scale")
    seed = _delegate("seed")

    def decoder(self, batch):
        """A streaming state for generation with step() (the core's decoder)."""
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
        # (`projection`, `codebook`, ...) becomes the core's (`core.projection`, ...).
        for name in self.core.TENSORS:
            old, new = prefix + name, f"{prefix}{_CORE}.{name}"
            if old in state_dict and new not in state_dict:
                state_dict[new] = state_dict.pop(old)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)


class FavorAttributes(CoreAttributes):
    """A favor.torch.FavorCore's attributes and methods (favor/torch/favor_core.py)."""

    projection = _delegate("projection")
    map_weight = _delegate("map_weight")
    map_bias = _delegate("map_bias")
    map_lambda = _delegate("map_lambda")
    decay_logit = _delegate("decay_logit")
    fit = _delegate("fit")
    kernel = _delegate("kernel")
    feature_redraw_interval = _delegate("feature_redraw_interval")
    redraws = _delegate("redraws")
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


class VQAttributes(CoreAttributes):
    """A favor.torch.VQCore's attributes and methods (favor/torch/vq_core.py)."""

    codebook = _delegate("codebook")
    ema_sum = _delegate("ema_sum")
    ema_count = _delegate("ema_count")
    unused = _delegate("unused")
    initialised = _delegate("initialised")
    updates = _delegate("updates")
    resets = _delegate("resets")
    codes_reset = _delegate("codes_reset")
    commitment_loss = _delegate("commitment_loss")
    codes = _delegate("codes")
    tau = _delegate("tau")
    dead_after = _delegate("dead_after")
    beta = _delegate("beta")
    learn_codebook = _delegate("learn_codebook")
    block = _delegate("block")
    kmeans_iterations = _delegate("kmeans_iterations")

    def initialise_codebook(self, k, key_padding_mask=None):
        """k-means on keys k [B, H, N, head_dim] now (VQCore.initialise_codebook)."""
        self.core.initialise_codebook(k, key_padding_mask)

    def dead_codes(self):
        """Codes no key of the latest training batch chose (VQCore.dead_codes)."""
        return self.core.dead_codes()
