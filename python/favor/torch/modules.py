"""favor.torch.FavorAttention: multi-head FAVOR attention as a module."""
from .. import _core
from .._args import fit_for
from ._feature_map import FeatureMapMixin, check_method, describe
from ._multihead import MultiHeadModule
from ._projection import ProjectionMixin
from .decoder import Decoder
from .function import attention


class FavorAttention(FeatureMapMixin, ProjectionMixin, MultiHeadModule):
    """Multi-head attention with FAVOR: q/k/v/out projections, heads, a causal flag.

    FavorAttention(embed_dim, num_heads, *, causal=False, kernel='positive', features=256,
                   projection='orthogonal', norms='chi', seed=0, feature_redraw_interval=None,
                   learn_projection=False, method='favor', scale=None, fit=None, bias=True,
                   kdim=None, vdim=None, device=None, dtype=None, learn_features=False,
                   feature_weights=False, decay=None, learn_decay=False,
                   feature_init='projection')

    forward(query [B, Nq, E], key=None, value=None, key_padding_mask=None) -> [B, Nq, E]
    (self-attention when key and value are None; key_padding_mask [B, Nk], True = ignore).
    One projection W [features, E / num_heads] shared by the heads, kept in the buffer
    `projection` (a Parameter with learn_projection=True, trained through dL/dW).
    method='exact' runs favor's exact softmax attention with the same weights.
    For generation: decoder(batch) and step(x, decoder).

    Learned feature maps (favor/torch/_feature_map.py): learn_features=True gives every head
    its own projection W [H, m, head_dim] and bias b [H, m] (Parameters map_weight, map_bias,
    from the drawn projection and 0, or from the favor.FeatureMap feature_init), e.g. with
    kernel='hedgehog'; feature_weights=True adds lambda [H, m] (map_lambda, from 1); decay
    (causal=True only; refused on a non-causal module): gamma in (0, 1], one or one per
    head, learned with learn_decay=True as gamma = sigmoid(decay_logit). feature_map()
    returns the current map as a favor.FeatureMap; decoder() carries the map and the decay.
    """

    def __init__(self, embed_dim, num_heads, *, causal=False, kernel="positive", features=256,
                 projection="orthogonal", norms="chi", seed=0, feature_redraw_interval=None,
                 learn_projection=False, method="favor", scale=None, fit=None, bias=True,
                 kdim=None, vdim=None, device=None, dtype=None, learn_features=False,
                 feature_weights=False, decay=None, learn_decay=False,
                 feature_init="projection"):
        super().__init__()
        check_method(method, learn_features, feature_weights, decay)
        self._init_heads(embed_dim, num_heads, causal, bias, kdim, vdim, device, dtype)
        if decay is not None and not causal:
            raise _core.Error("decay: gamma^(i - j) weighs causal attention only and this "
                              "module has causal=False, so every forward would refuse it; set "
                              "causal=True or leave decay (and learn_decay) unset")
        self.kernel, self.method, self.scale = kernel, method, scale
        self.fit = fit_for(fit, kernel, self.head_dim)
        self._init_projection(features, self.head_dim, projection, norms, seed,
                              learn_projection, feature_redraw_interval, device, dtype)
        self._init_feature_map(kernel, learn_features, feature_weights, decay, learn_decay,
                               feature_init, learn_projection, device, dtype)

    def attend(self, q, k, v, key_padding_mask=None, causal=None):
        """The attention core on [B, H, N, head_dim] tensors (no in/out projections)."""
        causal = self.causal if causal is None else causal
        extra = self._map_arguments(causal) if self._uses_map() else {}
        return attention(q, k, v, causal=causal, kernel=self.kernel, projection=self.projection,
                         scale=self.scale, key_padding_mask=key_padding_mask,
                         fit=self.fit_tensors, method=self.method, **extra)

    def _prepare(self, k, key_padding_mask):
        self._maybe_redraw()

    def decoder(self, batch):
        """A streaming state for generation with step(): favor.torch.Decoder over this
        module's heads, projection, kernel and scale."""
        if self.method != "favor":
            raise _core.Error("decoder: method='exact' has no fixed-size state; use favor")
        feature_map, decay = self._decoder_map()
        if feature_map is not None:
            return Decoder(batch, self.num_heads, self.head_dim, feature_map=feature_map,
                           decay=decay)
        return Decoder(batch, self.num_heads, self.head_dim, self.projection,
                       kernel=self.kernel, scale=self.scale, fit=self.fit)

    def extra_repr(self):
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, causal={self.causal}, "
                f"kernel={self.kernel}, features={self.features}, "
                f"projection={self.projection_kind}, method={self.method}" + describe(self))

