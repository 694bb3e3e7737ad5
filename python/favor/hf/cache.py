"""favor.hf.FavorCacheLayer and FavorCache: transformers cache layers that keep favor's decoding
state (a fixed-size DecodeState owned through a favor.torch.Decoder; hybrid attention: a
HybridDecodeState through a HybridDecoder; VQ: a VQDecodeState through a VQDecoder; each
advanced in place by its op) instead of keys and values:
generate()'s memory does not grow with the generated length.

How a layer reaches its state (no thread-local, no patched transformers method): favor.hf
.convert registers a forward pre-hook on every converted attention module that passes the
module's cache (the `cache` / `past_key_values` / `layer_past` argument the family's code
receives) on to the attention function as the keyword `favor_cache` (transformers forwards a
module's keyword arguments to its attention function). The function takes its layer from
it: `layer_for(cache, idx)`. A cache generate() made by itself (a DynamicCache) gets a
FavorCacheLayer in place of its key-value layer at the layer's first call, the prompt: the
cache's `layers` list is where transformers keeps one object per layer, and a favor layer
is such an object. FavorCache() makes favor layers from the start.

The prompt runs through the decoder's prefill (favor::decode_step, 'prefill': causal
attention that leaves the state; on the CPU one C++ sweep that featurises the keys once);
every later token is one step ('step': fused on the CPU, the fused Triton step on CUDA).
Under autograd the prompt goes through the layer's core instead (differentiable) and its
keys are then appended. After a layer's prompt on the CPU the allocator's freed memory goes
back to the system (favor.release_freed_memory: glibc keeps a long prompt's freed buffers
of each layer, which add up over the layers; docs/hf.md, "Memory"). Beam search reorders the state by batch index (reorder_cache).

A softmax layer of the plan (convert's softmax_layers) keeps keys and values: in a cache
generate() made, its transformers key-value layer stays; in a FavorCache, a FavorCacheLayer
holds them until favor's attention claims the layer at its prompt (a favor layer then
drops the prompt's keys and keeps its state only). state_bytes counts both.
"""
from transformers.cache_utils import Cache, CacheLayerMixin

import torch

from .. import _core
from ..torch.favor_core import FavorCore


class FavorCacheLayer(CacheLayerMixin):
    """One layer's favor decoding state (made at the prompt, from the layer's core)."""

    is_sliding = False
    is_croppable = False

    def __init__(self, **kwargs):
        super().__init__()
        self.decoder = None
        self.favor = False  # claimed by favor's attention (else: a softmax layer's keys)
        self.seen = 0  # tokens attended (a Python int: mask sizes are read without a sync)

    # The state has a fixed size and is advanced in place by its op (favor::decode_step,
    # favor::hybrid_decode_step, favor::vq_decode_step): a decoding step compiles.
    # A softmax layer's keys and values grow (not compileable; generate() then gives the
    # model its 2D mask, from which each layer gets its own, favor.hf.attention).
    @property
    def is_compileable(self):
        return self.favor

    def lazy_initialization(self, key_states, value_states):
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        """A favor layer: returns the new keys and values as they are (the attention function
        advances the state with them, attend, as it holds the layer's core). Until favor
        claims the layer (a softmax layer of the plan): appends them and returns all."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.favor:
            return key_states, value_states
        if self.keys is None:
            self.keys, self.values = key_states, value_states
        else:
            self.keys = torch.cat([self.keys, key_states], dim=-2)
            self.values = torch.cat([self.values, value_states], dim=-2)
        self.seen = self.keys.shape[-2]
        return self.keys, self.values

    def attend(self, core, q, k, v, keep, state=None):
        """Causal attention of the new tokens q, k, v [B, H, T, D] (float32) after the ones
        before, through the decoding state; keep [B, seen + T] or None. state(core, batch)
        makes the state at the prompt (the method's record, favor.hf.METHODS; default: the
        core's decoder)."""
        make = state if state is not None else (lambda c, batch: c.decoder(batch))
        t = q.shape[2]
        new = None if keep is None else keep[:, -t:]
        if not self.favor:  # claimed: the prompt's keys update() kept are not needed
            if self.keys is not None and self.keys.shape[-2] > t:
                raise _core.Error(f"cache: this layer holds {self.keys.shape[-2] - t} earlier "
                                  "tokens as keys and values (it ran as a softmax layer); "
                                  "favor's state starts at the prompt: give a fresh cache")
            self.favor, self.keys, self.values = True, None, None
        if self.decoder is None:
            pad = None if new is None else ~new
            grad = torch.is_grad_enabled() and q.requires_grad
            if isinstance(core, FavorCore) and core.method != "exact" and not grad:
                core.prepare(k, pad)
                self.decoder = make(core, q.shape[0])
                y = self.decoder.prefill(q, k, v, key_mask=new)
                core.learn(k, pad)
                if q.device.type == "cpu":  # the prompt's buffers back to the system, not
                    _core.release_freed_memory()  # kept by malloc (docs/hf.md, "Memory")
            else:  # VQ (no prefill) or autograd: the core, then the keys appended
                y = core(q, k, v, key_padding_mask=pad, causal=True)
                self.decoder = make(core, q.shape[0])
                self.decoder.append(k.detach(), v.detach(), key_mask=new)
            self.seen = t
            return y
        self.seen += t
        if t == 1:
            return self.decoder.step(q, k, v, key_mask=new)
        return self.decoder.prefill(q, k, v, key_mask=new)  # several tokens: causal

    def __del__(self):
        # A dropped cache (generate() returned) gives back what its steps freed, as the
        # prompt's layers did: a CPU state's process then holds what it did before.
        if self.__dict__.get("decoder") is not None and _core:
            _core.release_freed_memory()

    def offload(self):
        """The state is small and fixed: it stays where it is (no offloading)."""

    def prefetch(self):
        """See offload."""

    def get_mask_sizes(self, query_length, *args, **kwargs):
        return self.seen + query_length, 0

    def get_seq_length(self, *args, **kwargs):
        return self.seen

    def get_max_length(self):
        return -1

    def reset(self):
        self.decoder = None
        self.favor, self.keys, self.values = False, None, None
        self.seen = 0

    def reorder_cache(self, beam_idx):
        if self.decoder is not None:
            self.decoder.select(beam_idx)
        if self.keys is not None:
            index = beam_idx.to(self.keys.device)
            self.keys = self.keys.index_select(0, index)
            self.values = self.values.index_select(0, index)

    def batch_select_indices(self, indices):
        self.reorder_cache(indices)

    def batch_repeat_interleave(self, repeats):
        if self.decoder is not None:
            self.decoder.select(torch.arange(self.decoder.batch).repeat_interleave(repeats))
        if self.keys is not None:
            self.keys = self.keys.repeat_interleave(repeats, dim=0)
            self.values = self.values.repeat_interleave(repeats, dim=0)

    @property
    def state_bytes(self):
        """Bytes held: favor's state, or a softmax layer's keys and values."""
        held = 0 if self.decoder is None else self.decoder.state_bytes
        if self.keys is not None:
            held += self.keys.nbytes + self.values.nbytes
        return held


def layer_for(cache, idx, tokens):
    """The FavorCacheLayer of layer idx in cache (any transformers Cache): a layer that is
    not favor's yet (a key-value layer generate() made) is replaced by a fresh favor layer,
    which then holds the layer's state from the prompt on (tokens: this call's; a key-value
    layer that holds more, earlier tokens is refused, nothing changed). None when cache is not a Cache
    (an old tuple cache, or none)."""
    if not isinstance(cache, Cache):
        return None
    if getattr(cache, "layer_class_to_replicate", None) is not None:
        while len(cache.layers) <= idx:
            cache.layers.append(cache.layer_class_to_replicate())
    if idx >= len(cache.layers):
        raise _core.Error(f"cache: has {len(cache.layers)} layers, layer {idx} attends")
    layer = cache.layers[idx]
    if not isinstance(layer, FavorCacheLayer):
        keys = getattr(layer, "keys", None)
        if isinstance(keys, torch.Tensor) and keys.dim() == 4 and keys.shape[-2] > tokens:
            raise _core.Error(f"cache: layer {idx} holds {keys.shape[-2] - tokens} earlier "
                              "tokens as keys and values; favor's state starts at the prompt "
                              "(give a fresh cache, or favor.hf.FavorCache())")
        fresh = FavorCacheLayer()
        keys = getattr(layer, "keys", None)
        if isinstance(keys, torch.Tensor):
            fresh.lazy_initialization(keys, keys)
        cache.layers[idx] = fresh
        layer = fresh
    return layer


class FavorCache(Cache):
    """The cache of a model converted by favor.hf.convert: favor decoding state per layer, a
    fixed size whatever the number of tokens (state_bytes; the plan's softmax layers keep
    keys and values, which grow). generate() needs none (the
    layers of the cache it makes become favor's at the prompt); pass FavorCache() as `cache`
    to a forward loop of your own, or to generate()."""

    def __init__(self, *args, **kwargs):
        super().__init__(layer_class_to_replicate=FavorCacheLayer)

    @property
    def state_bytes(self):
        """Bytes held by all layers: favor's state and the softmax layers' keys and values."""
        return cache_bytes(self)


def cache_bytes(cache):
    """Bytes a transformers Cache holds, any mix of layers: favor's state (state_bytes) and
    key-value layers (their keys and values)."""
    total = 0
    for layer in getattr(cache, "layers", ()):
        if isinstance(layer, FavorCacheLayer):
            total += layer.state_bytes
        else:
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if isinstance(t, torch.Tensor):
                    total += t.nbytes
    return total
