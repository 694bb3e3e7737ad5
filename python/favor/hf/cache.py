"""favor.hf.FavorCache: a transformers Cache that keeps, per layer, favor's decoder state
(a fixed-size favor.torch.Decoder or VQDecoder) instead of keys and values: generate()'s
memory does not grow with the generated length.

The prompt runs through the chunked causal kernel: on CPU tensors, favor.torch.Decoder's
prefill (causal attention that leaves the decoder's state, key features computed once);
otherwise the layer's favor_core, whose keys and values are then appended to a fresh
decoder state (left padding: padded keys are masked out). Every later token is one fused
step (Decoder.step: append its key and value, query the state) on the CPU, append then
query elsewhere. Beam
search reorders the state by batch index (reorder_cache -> Decoder.select).
"""
import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from .. import _core
from ..ops._tensors import backend
from ..torch.favor_core import FavorCore
from .attention import hand_over


def _no_grad(q):
    return not (torch.is_grad_enabled() and q.requires_grad)


def _prefills(core, q):
    """Whether the prompt goes through favor.torch.Decoder.prefill: a FAVOR core (VQ has no
    prefill) on the CPU path, without autograd."""
    return (isinstance(core, FavorCore) and core.method == "favor"
            and backend(q, "q", core.backend) == "cpu" and _no_grad(q))


def _steps(decoder, q):
    """Whether a token goes through the decoder's fused step: on the CPU path (the device
    paths append and query), without autograd."""
    return backend(q, "q", getattr(decoder, "backend", None)) == "cpu" and _no_grad(q)


class FavorCacheLayer(CacheLayerMixin):
    """One layer's favor decoder state (made at the first call, from the layer's core)."""

    is_compileable = False
    is_sliding = False
    is_croppable = False

    def __init__(self, **kwargs):
        super().__init__()
        self.decoder = None
        self.length = 0

    def lazy_initialization(self, key_states, value_states):
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        """Counts the new tokens and returns them as they are: favor_attention appends them
        to the decoder state (it needs the layer's core, which the cache does not know)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.length += key_states.shape[-2]
        return key_states, value_states

    def attend(self, core, q, k, v, keep):
        """Causal attention of the new tokens q, k, v [B, H, T, D] (float32) after the ones
        before, through the decoder state; keep [B, seen + T] or None."""
        t = q.shape[2]
        new = None if keep is None else keep[:, -t:]
        if self.decoder is None:
            if self.length != t:
                raise _core.Error("cache: a FavorCache layer starts at the prompt; this one "
                                  f"saw {self.length - t} tokens without a state")
            pad = None if new is None else ~new
            if _prefills(core, q):  # causal attention and the decoder's state in one sweep
                core.prepare(k, pad)
                self.decoder = core.decoder(q.shape[0])
                y = self.decoder.prefill(q, k, v, key_mask=new)
                core.learn(k, pad)
                return y
            y = core(q, k, v, key_padding_mask=pad, causal=True)
            self.decoder = core.decoder(q.shape[0])
            self.decoder.append(k.detach(), v.detach(), key_mask=new)
            return y
        rows = []
        for i in range(t):  # one token at a time (several after the prompt: each in turn)
            ki, vi, qi = k[:, :, i:i + 1], v[:, :, i:i + 1], q[:, :, i:i + 1]
            keep_i = None if new is None else new[:, i:i + 1]
            if _steps(self.decoder, q):
                rows.append(self.decoder.step(qi, ki, vi, key_mask=keep_i))
            else:
                self.decoder.append(ki, vi, key_mask=keep_i)
                rows.append(self.decoder.query(qi))
        return (rows[0] if t == 1 else torch.cat(rows, dim=2)).to(q.device)

    def get_mask_sizes(self, query_length):
        return self.length + query_length, 0

    def get_seq_length(self):
        return self.length

    def get_max_length(self):
        return -1

    def reset(self):
        self.decoder = None
        self.length = 0

    def reorder_cache(self, beam_idx):
        if self.decoder is not None:
            self.decoder.select(beam_idx)

    def batch_select_indices(self, indices):
        self.reorder_cache(indices)

    def batch_repeat_interleave(self, repeats):
        if self.decoder is not None:
            self.decoder.select(torch.arange(self.decoder.batch).repeat_interleave(repeats))

    @property
    def state_bytes(self):
        return 0 if self.decoder is None else self.decoder.state_bytes


class FavorCache(Cache):
    """The cache of a model converted by favor.hf.convert: favor decoder state per layer,
    a fixed size whatever the number of tokens (state_bytes). generate() makes one by
    itself; pass FavorCache() as `cache` to a forward loop of your own."""

    def __init__(self):
        super().__init__(layer_class_to_replicate=FavorCacheLayer)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        keys, values = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        hand_over(layer_idx, self.layers[layer_idx])
        return keys, values

    @property
    def state_bytes(self):
        """Bytes of favor state held by all layers."""
        return sum(layer.state_bytes for layer in self.layers)
