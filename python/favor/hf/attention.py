"""favor's attention as a transformers attention function: registered as "favor" in
`AttentionInterface` (the softmax step of every converted layer) and in
`AttentionMaskInterface` (the mask the layers receive: the 2D padding mask, O(N), instead
of an [N, N] one).

The family's attention module computes q, k, v (after its rotary embedding), calls its
cache's update() and then this function with the module itself; the module carries its
`favor_core` (a favor.torch.FavorCore or VQCore, attached by favor.hf.convert) and, through
the forward pre-hook convert registers (`pass_cache`), the call receives the module's cache
as the keyword `favor_cache`: a causal layer then attends through its cache layer's favor
decoding state (favor.hf.cache.layer_for) instead of a key-value cache.

A model whose plan keeps some layers on softmax (convert's softmax_layers) gets two masks
from padding_mask, {"favor": the 2D padding mask, "softmax": the mask the model's own
implementation builds (its AttentionMaskInterface function, same arguments)}; a softmax
layer (module.favor_softmax names its implementation) calls that implementation with its
mask and its cache layer's keys and values, exactly as the unconverted model does.
"""
import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.masking_utils import (bidirectional_mask_function, causal_mask_function,
                                        prepare_padding_mask)

from .. import _core
from .cache import FavorCacheLayer, layer_for
from .capture import captured
from .families import FAMILIES

NAME = "favor"
CACHE_ARGUMENTS = ("cache", "past_key_values", "layer_past")  # the families' names for it


def pass_cache(module, args, kwargs):
    """The forward pre-hook of a converted attention module: its cache argument (any of
    CACHE_ARGUMENTS, as the family names it) passed on to the attention function as
    `favor_cache` (transformers forwards the module's keyword arguments to it)."""
    for name in CACHE_ARGUMENTS:
        cache = kwargs.get(name)
        if cache is not None:
            return args, {**kwargs, "favor_cache": cache}
    return None


def _hybrid(config):
    """Whether the model was converted to hybrid attention (window or sinks): its keys beyond
    the model's own sliding window are then served as favor serves every key beyond its
    window, by the estimator (docs/hf.md)."""
    spec = getattr(config, "favor", None) or {}
    return bool(spec.get("window") or spec.get("sinks"))


def _softmax_plan(config):
    """The implementation the plan's softmax layers run, or None (no softmax layers)."""
    spec = getattr(config, "favor", None) or {}
    return spec.get("softmax_attention") if spec.get("softmax_layers") else None


def padding_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0,
                 mask_function=causal_mask_function, attention_mask=None, config=None,
                 **kwargs):
    """The mask a converted layer receives: None (no padding) or a bool [B, kv_length]
    (True = the key takes part), from the 2D attention_mask. Causal order is the layer's
    own (module.is_causal). Masks favor cannot honour are refused: packed sequences, overlays
    and a sliding window the keys outrun (unless the conversion is hybrid). With softmax
    layers in the plan: {"favor": that mask, "softmax": the model's own mask}."""
    softmax = _softmax_plan(config)
    if softmax is not None:
        own = ALL_MASK_ATTENTION_FUNCTIONS[softmax](
            batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
            kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
            config=config, **kwargs)
        return {"favor": _padding_mask(kv_length, kv_offset, mask_function, attention_mask,
                                       config), "softmax": own}
    return _padding_mask(kv_length, kv_offset, mask_function, attention_mask, config)


def _padding_mask(kv_length, kv_offset, mask_function, attention_mask, config):
    if mask_function is not causal_mask_function and mask_function is not \
            bidirectional_mask_function:
        family = FAMILIES.get(getattr(config, "model_type", None))
        window = family.sliding_window(config) if family is not None else \
            getattr(config, "sliding_window", None)
        if window is None:
            raise _core.Error("attention_mask: the model builds a mask favor cannot honour "
                              f"({getattr(mask_function, '__qualname__', mask_function)}: packed "
                              "sequences or an overlay); favor attends causally or "
                              "bidirectionally with a padding mask")
        if kv_offset + kv_length > window and not _hybrid(config):
            raise _core.Error(f"sliding_window: {kv_offset + kv_length} keys outrun the model's "
                              f"window of {window}; favor attends to every earlier key (set "
                              "config.sliding_window = None to accept that)")
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2:
        raise _core.Error(f"attention_mask: a {attention_mask.dim()}D mask; favor takes the 2D "
                          "padding mask [batch, keys] (1 = take part), not a 4D mask or bias")
    mask = prepare_padding_mask(attention_mask, kv_length, kv_offset)
    keep = mask[:, kv_offset:kv_offset + kv_length].to(torch.bool)
    if torch.compiler.is_compiling():
        return keep  # a traced graph cannot branch on values
    return None if bool(keep.all()) else keep


def favor_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                    **kwargs):
    """query [B, H, Nq, D], key/value [B, Hkv, Nk, D] (Hkv divides H: grouped-query heads
    are repeated) -> ([B, Nq, H, Dv] in the query's dtype, None): the module's favor_core
    (favor computes in float32). Attention weights are never formed, so none are returned."""
    softmax = getattr(module, "favor_softmax", None)
    if softmax is not None:  # a softmax layer of the plan: the model's own attention
        if not isinstance(attention_mask, dict):
            raise _core.Error(f"attention_mask: layer {getattr(module, 'layer_idx', '?')} is a "
                              "softmax layer, and the model's mask function gave no softmax "
                              "mask (config.favor lists no softmax_layers)")
        kwargs.pop("favor_cache", None)
        return softmax_function(module, softmax)(module, query, key, value,
                                                 attention_mask["softmax"], scaling=scaling,
                                                 dropout=dropout, **kwargs)
    if isinstance(attention_mask, dict):
        attention_mask = attention_mask["favor"]
    core = getattr(module, "favor_core", None)
    if core is None:
        raise _core.Error(f"model: {type(module).__name__} (layer {getattr(module, 'layer_idx', '?')})"
                          " has no favor_core; convert the model with favor.hf.convert")
    if kwargs.get("output_attentions"):
        raise _core.Error("output_attentions: favor never forms the attention weights; call "
                          "without output_attentions")
    if attention_mask is not None and (not isinstance(attention_mask, torch.Tensor)
                                       or attention_mask.dtype != torch.bool
                                       or attention_mask.dim() != 2):
        raise _core.Error("attention_mask: favor takes the 2D padding mask (1 = take part); "
                          f"got {_describe(attention_mask)} (an additive bias or a 4D mask "
                          "cannot be honoured)")
    _refuse_packed(kwargs.get("position_ids"), attention_mask, query.shape[2])
    causal = bool(getattr(module, "is_causal", False))
    cache = kwargs.get("favor_cache")
    layer, idx = None, getattr(module, "layer_idx", 0)
    if cache is not None and causal and core.method != "exact":
        layer = layer_for(cache, idx, query.shape[2])
    elif core.method == "exact" and getattr(_cache_layer(cache, idx), "favor", False):
        raise _core.Error("cache: method 'exact' attends over keys and values; this cache "
                          f"layer ({idx}) holds favor state")
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads != kv_heads:
        key = key.repeat_interleave(heads // kv_heads, dim=1)
        value = value.repeat_interleave(heads // kv_heads, dim=1)
    dtype = query.dtype
    q, k, v = query.float(), key.float(), value.float()
    y = captured(module, q, k, v, attention_mask, causal)
    if y is not None:
        pass
    elif layer is not None and causal:
        y = layer.attend(core, q, k, v, attention_mask, getattr(module, "favor_state", None))
    else:
        y = _attend(core, q, k, v, attention_mask, causal)
    return y.transpose(1, 2).to(dtype), None


def _cache_layer(cache, idx):
    layers = getattr(cache, "layers", None) or []
    return layers[idx] if idx < len(layers) else None


def softmax_function(module, name):
    """The attention function `name` of a family's module, as the family's code picks it:
    its own eager_attention_forward for "eager", else transformers' AttentionInterface."""
    if name == "eager":
        import sys
        own = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
        if own is None:
            raise _core.Error(f"softmax_attention: {type(module).__name__} has no eager "
                              "attention function; use 'sdpa'")
        return own
    return ALL_ATTENTION_FUNCTIONS[name]


def _refuse_packed(position_ids, keep, nq):
    """favor.Error when position_ids [B or 1, Nq] restart inside a row: consecutive tokens
    that both take part (keep, the padding mask over the keys, whose last Nq are these
    tokens) must have consecutive positions. A restart packs several sequences into the row,
    and favor would attend across them as one. Padded tokens are not compared (generate()
    gives them position 1); one new token (a decoding step) has nothing to compare."""
    if not isinstance(position_ids, torch.Tensor) or position_ids.dim() != 2 or nq < 2 \
            or position_ids.shape[1] != nq or torch.compiler.is_compiling():
        return  # (a traced graph cannot branch on values: checked in eager runs only)
    restart = position_ids[:, 1:] != position_ids[:, :-1] + 1
    if keep is not None and keep.shape[-1] >= nq:
        tokens = keep[:, -nq:]
        restart = restart & tokens[:, 1:] & tokens[:, :-1]
    if bool(restart.any()):
        row, j = (int(x) for x in restart.nonzero()[0])
        pos = position_ids[min(row, position_ids.shape[0] - 1)]
        raise _core.Error(f"position_ids: row {row} goes from {int(pos[j])} to "
                          f"{int(pos[j + 1])} at token {j + 1}: the positions of a row's "
                          "tokens must rise by 1 (favor attends each row as one sequence, "
                          "so packed sequences are refused; give one sequence per row, padded "
                          "with attention_mask)")


def _attend(core, q, k, v, keep, causal):
    """Without a FavorCache: the whole sequence at once, or (exact attention over a key-value
    cache) one new query against every cached key."""
    nq, nk = q.shape[2], k.shape[2]
    ignore = None if keep is None else ~keep
    if nq == nk:
        return core(q, k, v, key_padding_mask=ignore, causal=causal)
    if nq == 1 and core.method == "exact":
        return core(q, k, v, key_padding_mask=ignore, causal=False)
    raise _core.Error(f"cache: {nq} queries against {nk} cached keys; a model converted to "
                      f"{core.method} generates with favor.hf.FavorCache (generate() makes one)")


def _describe(mask):
    if isinstance(mask, torch.Tensor):
        return f"a {mask.dim()}D {str(mask.dtype).replace('torch.', '')} tensor"
    return type(mask).__name__


def register():
    """Registers "favor" in transformers' attention and mask interfaces (idempotent)."""
    AttentionInterface.register(NAME, favor_attention)
    AttentionMaskInterface.register(NAME, padding_mask)
