"""The Hugging Face transformers families favor.hf converts, one Family record each
(FAMILIES): which module is a family's self-attention, whether it is an encoder or a
decoder, its attention projections (LoRA's default targets), what its configuration may ask
that favor cannot serve, and its sliding-window rule.

Every family here computes q, k, v (and rotary positions) itself and then calls
transformers' attention interface, `ALL_ATTENTION_FUNCTIONS[config._attn_implementation]`;
favor.hf registers its attention there ("favor"), so the family's own code keeps its
projections, rotary embeddings, scaling and cache calls, and only the softmax step changes.
convert, finetune and from_pretrained read these records; nothing else names a family.
"""
from dataclasses import dataclass

from .. import _core


def _cross_attention(config):
    if getattr(config, "is_encoder_decoder", False) or getattr(config, "add_cross_attention",
                                                                 False):
        return ("model: cross-attention (add_cross_attention / encoder-decoder) is not "
                "converted; favor.hf converts self-attention models")
    return None


def _relative_positions(config):
    kind = getattr(config, "position_embedding_type", "absolute")
    if kind != "absolute":
        return (f"model: position_embedding_type {kind!r} adds a relative-position term to "
                "the attention scores; favor serves only 'absolute'")
    return None


@dataclass(frozen=True)
class Family:
    """One transformers family.

    model_type: config.model_type. attention: the class name of its self-attention module.
    kind: 'encoder' (bidirectional) or 'decoder' (causal).
    projections: the q/k/v/o projection modules of that attention module, by attribute
        name (a fused one once: gpt2's c_attn, gpt_neox's query_key_value): LoRA's default
        targets (finetune), qualified by the attention module's path so an MLP module of
        the same name (gpt2's mlp.c_proj) is left alone.
    refusals: checks config -> message or None, each a configuration favor cannot serve
        (cross-attention for every family, then the family's own).
    window: the config attribute of its sliding window (Mistral, Qwen2), or None.
    """
    model_type: str
    attention: str
    kind: str
    projections: tuple
    refusals: tuple = (_cross_attention,)
    window: str = None

    def refuse(self, config):
        """favor.Error for the first thing the configuration asks that favor cannot serve."""
        for check in self.refusals:
            message = check(config)
            if message:
                raise _core.Error(message)

    def sliding_window(self, config):
        """The window of a family that masks to one, else None: a call whose keys outrun it
        is refused (favor attends to every earlier key, so it equals the windowed softmax
        only while the window holds them all)."""
        return None if self.window is None else getattr(config, self.window, None)

    def attention_modules(self, model):
        """[(qualified name, module)] of the family's self-attention modules, in layer
        order."""
        found = [(n, m) for n, m in model.named_modules() if type(m).__name__ == self.attention
                 and not getattr(m, "is_cross_attention", False)]
        if not found:
            raise _core.Error(f"model: no {self.attention} module found in the "
                              f"{self.model_type} model")
        return found

    def lora_targets(self, model):
        """peft target_modules: every attention module's projections, by qualified name."""
        return [f"{name}.{p}" for name, module in self.attention_modules(model)
                for p in self.projections if hasattr(module, p)]


_LLAMA = ("q_proj", "k_proj", "v_proj", "o_proj")
FAMILIES = {f.model_type: f for f in [
    Family("bert", "BertSelfAttention", "encoder", ("query", "key", "value"),
           refusals=(_cross_attention, _relative_positions)),
    Family("gpt2", "GPT2Attention", "decoder", ("c_attn", "c_proj")),
    Family("llama", "LlamaAttention", "decoder", _LLAMA),
    Family("mistral", "MistralAttention", "decoder", _LLAMA, window="sliding_window"),
    Family("qwen2", "Qwen2Attention", "decoder", _LLAMA, window="sliding_window"),
    Family("gpt_neox", "GPTNeoXAttention", "decoder", ("query_key_value", "dense")),
]}


def family(model):
    """The Family record of a model, or favor.Error naming the families."""
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in FAMILIES:
        raise _core.Error(f"model: a {type(model).__name__} (model_type {kind!r}) is not a "
                          f"family favor.hf converts; families: {', '.join(FAMILIES)}")
    return FAMILIES[kind]


def shapes(config):
    """(query heads, key/value heads, head size) from a config."""
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return heads, kv, head_dim
