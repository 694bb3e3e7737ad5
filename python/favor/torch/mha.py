"""favor.torch.MultiheadAttention: a drop-in for torch.nn.MultiheadAttention, by
composition: torch's parameters, checks and forward (TorchMultihead, _torch_multihead.py)
around a favor.torch.FavorCore, owned as `core` (its attributes on the layer:
_core_attributes.py)."""
from ._core_attributes import FavorAttributes
from ._torch_multihead import TorchMultihead
from .favor_core import FavorCore


class MultiheadAttention(FavorAttributes, TorchMultihead):
    """torch.nn.MultiheadAttention's constructor, parameters and forward, computed by favor.

    MultiheadAttention(embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                       add_zero_attn=False, kdim=None, vdim=None, batch_first=False,
                       device=None, dtype=None, *, kernel='positive', features=256,
                       projection='orthogonal', norms='chi', seed=0, method='favor',
                       causal=False, feature_redraw_interval=None, learn_projection=False,
                       scale=None, fit=None, learn_features=False, feature_weights=False,
                       decay=None, learn_decay=False, feature_init='projection',
                       backend=None, window=0, sinks=0)

    The parameters have torch's names and shapes (in_proj_weight or q/k/v_proj_weight,
    in_proj_bias, out_proj), so load_state_dict takes an nn.MultiheadAttention's state
    (favor.torch.convert does that for a whole model); favor's own tensors are the core's
    (`core.projection`, ...), kept when a state_dict lacks them. forward(query, key, value,
    key_padding_mask=None, need_weights=True, attn_mask=None, average_attn_weights=True,
    is_causal=False) returns (output, None). What favor cannot do is refused with a clear
    error, never approximated silently: an explicit need_weights=True (favor never forms
    the weights: pass need_weights=False; torch's default is ignored), an attn_mask without
    is_causal=True (torch 2.x's hint that it is the causal mask; favor does not read the
    L x S mask) on a non-causal module, add_bias_kv and add_zero_attn. dropout on the attention weights
    has no FAVOR equivalent: it is kept as an attribute and not applied (a warning says so).
    learn_features, feature_weights, decay, learn_decay, feature_init: the learned feature
    map and decay, as in favor.torch.FavorAttention (Parameters map_weight, map_bias,
    map_lambda, decay_logit of the core). decay applies to causal calls only (causal=True, or a call
    with is_causal=True): the others (cross-attention, unmasked
    self-attention) run without it, and a learned decay trains through the causal calls.
    window, sinks: hybrid attention (favor.torch.attention's) on self-attention calls
    (Nq = Nk; a cross-attention call with them is refused).
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                 add_zero_attn=False, kdim=None, vdim=None, batch_first=False, device=None,
                 dtype=None, *, kernel="positive", features=256, projection="orthogonal",
                 norms="chi", seed=0, method="favor", causal=False, feature_redraw_interval=None,
                 learn_projection=False, scale=None, fit=None, warn_dropout=True,
                 learn_features=False, feature_weights=False, decay=None, learn_decay=False,
                 feature_init="projection", backend=None, window=0, sinks=0):
        super().__init__(embed_dim, num_heads, dropout, bias, add_bias_kv, add_zero_attn, kdim,
                         vdim, batch_first, device, dtype, warn_dropout, causal)
        self.core = FavorCore(num_heads, self.head_dim, causal=causal, kernel=kernel,
                              features=features, projection=projection, norms=norms, seed=seed,
                              feature_redraw_interval=feature_redraw_interval,
                              learn_projection=learn_projection, method=method, scale=scale,
                              fit=fit, learn_features=learn_features,
                              feature_weights=feature_weights, decay=decay,
                              learn_decay=learn_decay, feature_init=feature_init, device=device,
                              dtype=dtype, backend=backend, window=window, sinks=sinks)
