"""favor.models: small complete models built on favor.torch (needs torch).

- CharTransformer: a decoder-only character-level transformer whose attention layers are
  favor's (exact, FAVOR+, FAVOR++/#, learned maps, decay, Transformer-VQ), with streamed
  generation (favor's decoders, or a key-value cache for exact attention).
- convert_attention(model, **spec): the same model with every attention layer replaced.
- data: the character vocabulary, train/validation split, windows and bits per character.
- training: presets, the learning-rate schedule, checkpoints and the training loop.

examples/shakespeare/ trains one on tinyshakespeare; docs: examples/shakespeare/README.md.
"""
from .char_transformer import CharTransformer, attention_spec, convert_attention
from .data import CharData, bits_per_char

__all__ = ["CharData", "CharTransformer", "attention_spec", "bits_per_char",
           "convert_attention"]
