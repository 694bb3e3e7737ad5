"""favor.torch.FavorAttention: multi-head FAVOR attention as a module, by composition: the
multi-head machinery (MultiHeadModule: q/k/v/out projections, heads, forward, step) around a
favor.torch.FavorCore, owned as `core`, which holds the projection, the map, the decay and
the kernel configuration (their names on the layer: _core_attributes.py)."""
from .. import _core
from ._core_attributes import FavorAttributes
from ._multihead import MultiHeadModule
from .favor_core import FavorCore


class FavorAttention(FavorAttributes, MultiHeadModule):
    """Multi-head attention with FAVOR: q/k/v/out projections, heads, a causal flag.

    FavorAttention(embed_dim, num_heads, *, causal=False, kernel='positive', features=256,
                   projection='orthogonal', norms='chi', seed=0, feature_redraw_interval=None,
                   learn_projection=False, method='favor', scale=None, fit=None, bias=True,
                   kdim=None, vdim=None, device=None, dtype=None, learn_features=False,
                   feature_weights=False, decay=None, learn_decay=False,
                   feature_init='projection', backend=None, window=0, sinks=0)

    forward(query [B, Nq, E], key=None, value=None, key_padding_mask=None) -> [B, Nq, E]
    (self-attention when key and value are None; key_padding_mask [B, Nk], True = ignore).
    The attention itself is `core`, a favor.torch.FavorCore with the FAVOR keywords; its
    attributes and methods are the layer's too (projection, features, kernel, method, scale,
    fit, redraw(), fix_projection(), ...). One projection W [features, E / num_heads] shared
    by the heads, kept in the buffer `projection` (state_dict key `core.projection`; a
    Parameter with learn_projection=True, trained through dL/dW).
    method='exact' runs favor's exact softmax attention with the same weights.
    For generation: decoder(batch) and step(x, decoder).

    Learned feature maps (favor/torch/favor_core.py): learn_features=True gives every head
    its own projection W [H, m, head_dim] and bias b [H, m] (Parameters map_weight, map_bias:
    core.map_weight, core.map_bias in the state_dict; from the drawn projection and 0, or
    from the favor.FeatureMap feature_init), e.g. with kernel='hedgehog'; feature_weights=True
    adds lambda [H, m] (map_lambda, from 1); decay
    (causal=True only; refused on a non-causal module): gamma in (0, 1], one or one per
    head, learned with learn_decay=True as gamma = sigmoid(decay_logit). feature_map()
    returns the current map as a favor.FeatureMap; decoder() carries the map and the decay.
    """

    def __init__(self, embed_dim, num_heads, *, causal=False, kernel="positive", features=256,
                 projection="orthogonal", norms="chi", seed=0, feature_redraw_interval=None,
                 learn_projection=False, method="favor", scale=None, fit=None, bias=True,
                 kdim=None, vdim=None, device=None, dtype=None, learn_features=False,
                 feature_weights=False, decay=None, learn_decay=False,
                 feature_init="projection", backend=None, window=0, sinks=0):
        super().__init__()
        self._init_heads(embed_dim, num_heads, causal, bias, kdim, vdim, device, dtype)
        if decay is not None and not causal:
            raise _core.Error("decay: gamma^(i - j) weighs causal attention only and this "
                              "module has causal=False, so every forward would refuse it; set "
                              "causal=True or leave decay (and learn_decay) unset")
        self.core = FavorCore(num_heads, self.head_dim, causal=causal, kernel=kernel,
                              features=features, projection=projection, norms=norms, seed=seed,
                              feature_redraw_interval=feature_redraw_interval,
                              learn_projection=learn_projection, method=method, scale=scale,
                              fit=fit, learn_features=learn_features,
                              feature_weights=feature_weights, decay=decay,
                              learn_decay=learn_decay, feature_init=feature_init, device=device,
                              dtype=dtype, backend=backend, window=window, sinks=sinks)

    def extra_repr(self):
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, causal={self.causal}"
