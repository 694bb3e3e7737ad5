"""Tiny random transformers models of every family favor.hf converts, for test_hf*.py: no
weights are downloaded. initializer_range 0.3 makes the logits decisive (the default 0.02
leaves near-ties that float rounding may flip, which would make greedy comparisons
meaningless)."""
import torch
import transformers as tf

V = 40
_COMMON = dict(vocab_size=V, initializer_range=0.3)


def make(family, **overrides):
    """A tiny model of `family` in eval mode (seeded)."""
    torch.manual_seed(0)
    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    small.update({k: overrides.pop(k) for k in list(overrides) if k in small})
    if family == "llama":
        m = tf.LlamaForCausalLM(tf.LlamaConfig(**small, num_key_value_heads=2, **_COMMON,
                                               **overrides))
    elif family == "mistral":
        m = tf.MistralForCausalLM(tf.MistralConfig(**small, num_key_value_heads=1, **_COMMON,
                                                   **{"sliding_window": 64, **overrides}))
    elif family == "qwen2":
        m = tf.Qwen2ForCausalLM(tf.Qwen2Config(**small, num_key_value_heads=2, **_COMMON,
                                               **overrides))
    elif family == "gpt2":
        m = tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=32, n_layer=small["num_hidden_layers"],
                                             n_head=4, n_positions=64,
                                             bos_token_id=0, eos_token_id=0, **_COMMON,
                                             **overrides))
    elif family == "gpt_neox":
        m = tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(**small, rotary_pct=0.5, **_COMMON,
                                                   **overrides))
    elif family == "bert":
        m = tf.BertModel(tf.BertConfig(**small, **_COMMON, **overrides))
    else:
        raise ValueError(family)
    if hasattr(m, "generation_config"):  # no end-of-sequence token: generate() runs to the end
        m.generation_config.eos_token_id = None
        m.generation_config.pad_token_id = 0
    return m.eval()


DECODERS = ["llama", "mistral", "qwen2", "gpt2", "gpt_neox"]
FAMILIES = DECODERS + ["bert"]


def inputs(batch=2, n=10, pad=3, left=True, seed=1):
    """ids [batch, n] and an attention mask with `pad` padded positions in row 1 (on the
    left for decoders, on the right for encoders)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (batch, n), generator=g)
    mask = torch.ones(batch, n, dtype=torch.long)
    if pad:
        if left:
            mask[1, :pad] = 0
        else:
            mask[1, n - pad:] = 0
    return ids, mask


def batches(count=3, n=16, seed=20):
    """`count` dicts of model inputs (input_ids, attention_mask), from inputs(n=n) with the
    seeds seed, seed + 1, ...: calibration or distillation batches."""
    out = []
    for i in range(count):
        ids, mask = inputs(n=n, seed=seed + i)
        out.append(dict(input_ids=ids, attention_mask=mask))
    return out


def positions(mask):
    """The position ids generate() gives a left-padded batch (cumulative mask - 1)."""
    return (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)


def run(model, ids, mask):
    """The model's output tensor (logits, or an encoder's last hidden state)."""
    if isinstance(model, tf.BertModel):
        return model(ids, attention_mask=mask).last_hidden_state
    return model(ids, attention_mask=mask, position_ids=positions(mask)).logits


def generates_as_full_forward(model, ids, mask, new=6, atol=1e-4):
    """Greedy generate() of `new` tokens through the model's cache against its own full
    forward of the whole sequence (left padding kept): the logits agree to atol and the
    tokens are the full forward's argmax. Returns the sequences."""
    n = ids.shape[1]
    out = model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False,
                         output_logits=True, return_dict_in_generate=True)
    logits = torch.stack(out.logits, 1)
    full_mask = torch.cat([mask, torch.ones(ids.shape[0], new, dtype=mask.dtype)], 1)
    full = run(model, out.sequences, full_mask)[:, n - 1:-1]
    torch.testing.assert_close(logits, full, rtol=0, atol=atol)
    assert torch.equal(full.argmax(-1), out.sequences[:, n:])
    return out.sequences
