"""The Hugging Face transformers families favor.hf converts: which module is a family's
self-attention, its head counts and head size, and what it does that favor cannot serve.

Every family here computes q, k, v (and rotary positions) itself and then calls
transformers' attention interface, `ALL_ATTENTION_FUNCTIONS[config._attn_implementation]`;
favor.hf registers its attention there ("favor"), so the family's own code keeps its
projections, rotary embeddings, scaling and cache calls, and only the softmax step changes.
"""
from .. import _core

# model_type -> the class name of its self-attention module
ATTENTION_CLASSES = {
    "bert": "BertSelfAttention",
    "gpt2": "GPT2Attention",
    "llama": "LlamaAttention",
    "mistral": "MistralAttention",
    "qwen2": "Qwen2Attention",
    "gpt_neox": "GPTNeoXAttention",
}
FAMILY = {"bert": "encoder", "gpt2": "decoder", "llama": "decoder", "mistral": "decoder",
          "qwen2": "decoder", "gpt_neox": "decoder"}


def model_type(model):
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in ATTENTION_CLASSES:
        raise _core.Error(f"model: a {type(model).__name__} (model_type {kind!r}) is not a "
                          f"family favor.hf converts; families: {', '.join(ATTENTION_CLASSES)}")
    return kind


def refusals(config, kind):
    """favor.Error for what the family's configuration asks that favor cannot serve."""
    if getattr(config, "is_encoder_decoder", False) or getattr(config, "add_cross_attention",
                                                                 False):
        raise _core.Error("model: cross-attention (add_cross_attention / encoder-decoder) is "
                          "not converted; favor.hf converts self-attention models")
    if kind == "bert" and getattr(config, "position_embedding_type", "absolute") != "absolute":
        raise _core.Error(f"model: position_embedding_type "
                          f"{config.position_embedding_type!r} adds a relative-position term "
                          "to the attention scores; favor serves only 'absolute'")


def sliding_window(config, kind):
    """The window of a family that masks to one (Mistral; Qwen2 with use_sliding_window),
    else None: a call whose keys outrun it is refused (favor attends to every earlier key,
    so it equals the windowed softmax only while the window holds them all)."""
    if kind in ("mistral", "qwen2"):
        return getattr(config, "sliding_window", None)
    return None


def shapes(config):
    """(query heads, key/value heads, head size) from a config."""
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return heads, kv, head_dim


def attention_modules(model, kind):
    """[(qualified name, module)] of the family's self-attention modules, in layer order."""
    name = ATTENTION_CLASSES[kind]
    found = [(n, m) for n, m in model.named_modules() if type(m).__name__ == name
             and not getattr(m, "is_cross_attention", False)]
    if not found:
        raise _core.Error(f"model: no {name} module found in the {kind} model")
    return found
