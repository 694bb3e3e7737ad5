"""favor.hf: Hugging Face transformers models on favor's attention (docs/hf.md).

- convert(model, method, **options): every self-attention layer of a BERT-style encoder
  (BERT, sentence-transformers' MiniLM), GPT-2, a Llama-style decoder (Llama, Mistral,
  Qwen2) or GPT-NeoX (Pythia) attends through favor, weights kept; returns a report.
- FavorCache: the cache generate() uses on a converted decoder, favor's fixed-size decoder
  state per layer instead of keys and values.
- transfer(model, batches, ...): attention transfer, each layer's map fitted to its own
  softmax attention (stage 1), layer by layer; finetune(...) (stage 2, optional LoRA).
- save_pretrained / from_pretrained: a converted model and its maps and fits.
"""
from .attention import NAME, favor_attention, padding_mask, register
from .cache import FavorCache, FavorCacheLayer
from .convert import METHODS, ConversionReport, convert, cores
from .families import ATTENTION_CLASSES as FAMILIES
from .finetune import finetune
from .pretrained import from_pretrained, save_pretrained
from .transfer import TransferReport, transfer

__all__ = ["FAMILIES", "METHODS", "NAME", "ConversionReport", "FavorCache", "FavorCacheLayer",
           "TransferReport", "convert", "cores", "favor_attention", "finetune", "from_pretrained",
           "padding_mask", "register", "save_pretrained", "transfer"]
