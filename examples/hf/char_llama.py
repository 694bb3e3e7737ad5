"""A small Llama-architecture character model on tinyshakespeare, with Hugging Face transformers.

    from char_llama import load_data, make_model, train, bits_per_char, load
    data = load_data()                        # CharData over tinyshakespeare (90/10 split)
    model = make_model(data.vocab)            # LlamaForCausalLM: 128 wide, 4 layers, GQA 4/2
    train(model, data, 1500, eval_every=250)  # AdamW, warmup + cosine, tqdm progress bar
    bits_per_char(model, data)                # 64 fixed validation windows of 256 characters
    model, data = load("examples/hf/char_llama")

The checkpoint directory is model.save_pretrained(dir, safe_serialization=True) plus
vocab.json ({"chars": the vocabulary string}) and training.json (the recipe and result).

Loss: the window x [B, 256] and its targets y = x shifted by one character [B, 256] come
from CharData.batch; the cross-entropy is computed here from the model's logits against y
(no `labels=` argument, so nothing is shifted inside the model and every one of the 256
positions is predicted). Besides CharData (favor.models.data) nothing of favor is used.
"""
import json
import math
import os
import time

import torch
from torch.nn import functional as F

from favor.models.data import CharData

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(REPO, "examples", "shakespeare", "data", "tinyshakespeare.txt")
CHECKPOINT = os.path.join(REPO, "examples", "hf", "char_llama")

CONFIG = dict(hidden_size=128, intermediate_size=352, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16384,
              rope_theta=10000.0, tie_word_embeddings=True, attention_bias=False,
              rms_norm_eps=1e-5, bos_token_id=None, eos_token_id=None)  # characters only:
# no special tokens (LlamaConfig's default end-of-sequence id 2 would be the character "!")


def load_data(path=None, chars=None):
    """CharData over `path` (default: the repo's tinyshakespeare.txt); `chars`: a recorded
    vocabulary string to encode with (default: the text's sorted characters)."""
    return CharData.from_file(path or DATA, chars=chars)


def make_model(vocab, attn_implementation="sdpa", **overrides):
    """A LlamaForCausalLM over `vocab` characters with CONFIG (keywords override any
    LlamaConfig field, e.g. hidden_size=32, num_hidden_layers=1)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=vocab, **{**CONFIG, **overrides})
    cfg._attn_implementation = attn_implementation
    return LlamaForCausalLM(cfg)


def _logits(model, x):
    out = model(input_ids=x) if _is_hf(model) else model(x)
    return out.logits if hasattr(out, "logits") else out


def _is_hf(model):
    try:
        from transformers import PreTrainedModel
        return isinstance(model, PreTrainedModel)
    except ImportError:
        return False


def lr_at(step, steps, lr, warmup, final_lr):
    """Linear warmup over `warmup` steps to `lr`, then a cosine to `final_lr` at `steps`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return final_lr + 0.5 * (lr - final_lr) * (1 + math.cos(math.pi * min(1.0, t)))


@torch.no_grad()
def bits_per_char(model, data, split="val", context=256, count=64, batch=16):
    """Bits per character on `count` fixed windows of `context` characters (data.windows):
    the summed cross-entropy of the logits against the shifted targets / characters / ln 2.
    Eval mode, restored afterwards."""
    x, y = data.windows(split, context, count)
    was_training = model.training
    model.eval()
    total = 0.0
    try:
        for i in range(0, count, batch):
            logits = _logits(model, x[i:i + batch]).float()
            total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                     y[i:i + batch].reshape(-1), reduction="sum").item()
    finally:
        model.train(was_training)
    return total / y.numel() / math.log(2.0)


def train(model, data, steps, *, lr=3e-3, warmup=100, final_lr=3e-4, batch=32, context=256,
          seed=0, eval_every=None, weight_decay=0.1, clip=1.0, log=print, progress=True):
    """Train `model` (any nn.Module whose forward(input_ids) returns .logits, or logits) for
    `steps` AdamW steps on random training windows (a torch.Generator seeded with `seed`);
    parameters with requires_grad False are left alone. Weight decay on matrices only
    (dim >= 2; norms' gains are not decayed), gradient norm clipped to `clip`. Every
    `eval_every` steps and at the end: validation bits per character (bits_per_char).
    Returns [(step, val_bpc), ...]."""
    from tqdm import tqdm
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    other = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": other, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(seed)
    log(f"train: seed {seed}, {steps} steps, batch {batch}, context {context}, lr {lr} "
        f"(warmup {warmup}, cosine to {final_lr}), {sum(p.numel() for p in params)} trainable "
        f"parameters")
    model.train()
    evals = []
    bar = tqdm(range(steps), disable=not progress, dynamic_ncols=True)
    loss_avg = None
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, warmup, final_lr)
        x, y = data.batch("train", batch, context, gen)
        logits = _logits(model, x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        v = loss.item()
        if not math.isfinite(v):
            raise FloatingPointError(f"step {step + 1}: loss {v}")
        loss_avg = v if loss_avg is None else 0.95 * loss_avg + 0.05 * v
        bar.set_postfix(loss=f"{loss_avg:.3f}", bpc=f"{loss_avg / math.log(2):.3f}")
        done = step + 1
        if (eval_every and done % eval_every == 0) or done == steps:
            bpc = bits_per_char(model, data, "val", context)
            evals.append((done, bpc))
            log(f"step {done}: train loss {loss_avg:.4f}, val bpc {bpc:.4f}")
    return evals


def save(model, data, out, training=None):
    """model.save_pretrained(out, safe_serialization=True) + vocab.json (+ training.json)."""
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    with open(os.path.join(out, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump({"chars": data.chars}, f, ensure_ascii=False)
    if training is not None:
        with open(os.path.join(out, "training.json"), "w", encoding="utf-8") as f:
            json.dump(training, f, indent=2)


def load(dir=None, data_path=None, attn_implementation="sdpa"):
    """(model, data): LlamaForCausalLM.from_pretrained(dir) (default: the shipped
    examples/hf/char_llama) in eval mode, and CharData over `data_path` encoded with the
    checkpoint's vocabulary (vocab.json)."""
    from transformers import LlamaForCausalLM
    dir = dir or CHECKPOINT
    with open(os.path.join(dir, "vocab.json"), encoding="utf-8") as f:
        chars = json.load(f)["chars"]
    model = LlamaForCausalLM.from_pretrained(dir, attn_implementation=attn_implementation)
    model.eval()
    return model, load_data(data_path, chars=chars)


def main(argv=None):
    """CLI: train a model from scratch and write the checkpoint directory --out."""
    import argparse
    p = argparse.ArgumentParser(description="Train the char Llama on tinyshakespeare.")
    p.add_argument("--out", required=True, help="checkpoint directory (save_pretrained)")
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--eval-every", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--data", default=None)
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: 10 steps of 8 windows of 64 characters")
    a = p.parse_args(argv)
    steps, batch, context = (10, 8, 64) if a.quick else (a.steps, 32, 256)
    torch.set_num_threads(a.threads)
    print(f"seed {a.seed}", flush=True)
    torch.manual_seed(a.seed)
    data = load_data(a.data)
    model = make_model(data.vocab)
    t0 = time.time()
    evals = train(model, data, steps, batch=batch, context=context, seed=a.seed,
                  eval_every=a.eval_every, log=lambda s: print(s, flush=True))
    wall = time.time() - t0
    bpc = evals[-1][1]
    print(f"done: {steps} steps in {wall:.0f} s ({wall / steps:.3f} s/step), "
          f"val bpc {bpc:.4f}", flush=True)
    training = dict(recipe=dict(model="LlamaForCausalLM", **CONFIG, vocab_size=data.vocab,
                                attn_implementation="sdpa", batch=batch, context=context,
                                optimizer="AdamW(betas=(0.9, 0.95))", lr=3e-3, warmup=100,
                                schedule="linear warmup, cosine", final_lr=3e-4,
                                weight_decay=0.1, weight_decay_on="matrices (dim >= 2)",
                                grad_clip=1.0, threads=a.threads,
                                loss="cross-entropy of logits vs y = x shifted by one "
                                     f"(CharData.batch), all {context} positions"),
                    seed=a.seed, steps=steps, wall_time_s=round(wall, 1),
                    s_per_step=round(wall / steps, 4), evals=evals,
                    final_val_bpc=bpc, val_bpc_eval=f"64 fixed windows of {context} chars "
                                                    "(CharData.windows)")
    save(model, data, a.out, training)
    print(f"wrote {a.out}", flush=True)
    return evals


if __name__ == "__main__":
    main()
