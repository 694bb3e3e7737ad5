"""favor.hf: Hugging Face transformers models on favor's attention (docs/hf.md).

- convert(model, method, **options): every self-attention layer of a BERT-style encoder
  (BERT, sentence-transformers' MiniLM), GPT-2, a Llama-style decoder (Llama, Mistral,
  Qwen2) or GPT-NeoX (Pythia) attends through favor, weights kept; returns a report.
- FAMILIES (model_type -> Family) and METHODS (name -> Method): the registries every
  step reads; FavorConfig: the conversion, recorded in model.config.favor.
- FavorCache: the cache generate() uses on a converted decoder, favor's fixed-size decoder
  state per layer instead of keys and values.
- transfer(model, batches, ...): attention transfer, each layer's map fitted to its own
  softmax attention (stage 1), layer by layer; finetune(...) (stage 2, optional LoRA).
- distill(student, teacher, batches, ...): end-to-end distillation to the original's
  next-token distributions (stage 2), in bf16 where the machine has it; TeacherCache: the
  teacher's top-k distributions computed once and kept on disk for every run.
- convert(..., softmax_layers=[i, ...]): a per-layer plan, those layers on the model's own
  softmax attention; rank_layers(student, teacher, batches, recall=, greedy=) chooses them
  by measurement (softmax_at: a plan tried inside a block); favor.hf.longrange measures what
  a model carries from beyond its window (copy recall, passkey, perplexity, agreement).
- save_pretrained / from_pretrained: a converted model with its maps and fits (plain
  model.save_pretrained keeps them all).
"""
from .attention import NAME, favor_attention, padding_mask, register
from .cache import FavorCache, FavorCacheLayer, cache_bytes
from .adapters import add_adapters, merge_adapters, merged
from .convert import ConversionReport, convert, cores
from .distill import DistillReport, distill
from .families import FAMILIES, Family
from .finetune import finetune
from .layers import RankReport, gates, rank_layers, softmax_at
from .methods import METHODS, FavorConfig, Method
from .pretrained import from_pretrained, save_pretrained
from .teacher_cache import TeacherCache
from .transfer import TransferReport, transfer

__all__ = ["FAMILIES", "METHODS", "NAME", "ConversionReport", "DistillReport", "Family",
           "FavorCache", "FavorCacheLayer", "FavorConfig", "Method", "RankReport", "TeacherCache",
           "TransferReport",
           "add_adapters", "cache_bytes", "convert", "cores", "distill", "favor_attention",
           "finetune", "gates",
           "from_pretrained", "merge_adapters", "merged", "padding_mask", "rank_layers", "register",
           "save_pretrained", "softmax_at", "transfer"]
