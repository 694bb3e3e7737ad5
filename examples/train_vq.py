"""Train a small causal transformer with Transformer-VQ attention (EMA codebooks) on the copy
task of train_copy.py, next to the same model with exact softmax attention.

    x1 x2 ... xL | x1 x2 ... xL      (next-token prediction; loss on the second half)

Copying needs each output to attend to the one position L + 1 tokens back. With VQ the keys
are quantised to `codes` codes per head, so a query can single out a key only through its
code: the codebook must learn to separate the positions the copy needs.

Both models start from the same seed: the VQ model is the exact model with each attention
replaced by favor.torch.VQAttention carrying the same q/k/v/out weights. The codebooks are
initialised by k-means on the first batch's keys, follow the keys by EMA updates after every
training step (codes unused for `dead_after` steps are re-seeded from keys), and the
commitment loss (beta |k - sg(C_z)|^2) is added to the task loss.

    PYTHONPATH=build/python python3 examples/train_vq.py              # both, ~20 s
    PYTHONPATH=build/python python3 examples/train_vq.py --quick      # ~10 s
    PYTHONPATH=build/python python3 examples/train_vq.py --codes 16 --seed 1

From Python: `from train_vq import train; r = train('vq', steps=300, seed=0)`.
"""
import argparse
import dataclasses

import numpy as np
import torch
from torch import nn

import favor
import favor.torch as ft
from train_copy import (CausalTransformer, copy_batch, evaluate, optimise, print_curves,
                        print_heldout)

DEFAULTS = dict(symbols=16, length=12, d_model=64, heads=4, layers=2, codes=32, lr=3e-3,
                batch=64, steps=300, beta=0.25, decay=0.99, dead_after=20)


@dataclasses.dataclass
class TrainResult:
    method: str
    seed: int
    losses: list           # task loss of every step (mean over the copied half)
    final_loss: float      # held-out loss (eval mode)
    accuracy: float        # held-out per-token accuracy on the copied half
    sequence_accuracy: float
    dead_codes: list       # per layer: codes no key of the last training batch chose
    heldout_dead: list     # per layer: codes no key of the held-out sequences chose
    codes_reset: list      # per layer: codes re-seeded during training
    seconds: float
    config: dict
    model: nn.Module = dataclasses.field(repr=False, default=None)


def vq_model(exact, c, seed):
    """The exact model with each attention replaced by VQAttention (same weights)."""
    for i, block in enumerate(exact.blocks):
        old = block.attn
        new = ft.VQAttention(old.embed_dim, old.num_heads, c["codes"], causal=True,
                             beta=c["beta"], decay=c["decay"], dead_after=c["dead_after"],
                             seed=seed + 1000 * i)
        new.load_state_dict(old.state_dict(), strict=False)  # q/k/v/out; no codebook yet
        block.attn = new
    return exact


@torch.no_grad()
def heldout_dead_codes(model, c, sequences=1024, seed=12345):
    """Per layer, the codes (over all heads) that no key of `sequences` held-out sequences
    is assigned to: a code no data uses is dead, whatever the last batch did."""
    keys = []
    hooks = [b.attn.k_proj.register_forward_hook(lambda m, i, o: keys.append(o))
             for b in model.blocks]
    model.eval()
    inputs, _, _ = copy_batch(sequences, c["symbols"], c["length"],
                              torch.Generator().manual_seed(seed))
    model(inputs)
    model.train()
    for h in hooks:
        h.remove()
    dead = []
    for block, k in zip(model.blocks, keys):
        a = block.attn
        z = favor.vq_assign(a._heads(k).contiguous().numpy(), a.codebook.numpy())  # [B, H, N]
        used = sum(len(np.unique(z[:, h])) for h in range(a.num_heads))
        dead.append(a.num_heads * a.codes - used)
    return dead


def train(method="vq", steps=None, seed=0, log_every=0, **overrides):
    """Trains on the copy task with method 'vq' or 'exact'; everything follows from `seed`
    (weights, codebook k-means, dead-code re-seeding, batches). overrides: DEFAULTS keys."""
    c = dict(DEFAULTS)
    c.update({k: v for k, v in overrides.items() if v is not None})
    if steps is not None:
        c["steps"] = steps
    torch.manual_seed(seed)
    model = CausalTransformer(c["symbols"] + 1, 2 * c["length"], c["d_model"], c["heads"],
                              c["layers"], method="exact", seed=seed)
    if method == "vq":
        model = vq_model(model, c, seed)
    elif method != "exact":
        raise ValueError(f"method: '{method}' must be vq or exact")
    attns = [b.attn for b in model.blocks]
    vq = method == "vq"
    losses, seconds = optimise(
        model, c, seed, method, log_every,
        extra_loss=(lambda: sum(a.commitment_loss for a in attns)) if vq else None,
        log_extra=(lambda: f"  dead codes {[a.dead_codes() for a in attns]}") if vq else None)
    dead = [a.dead_codes() for a in attns] if vq else []
    reset = [a.codes_reset for a in attns] if vq else []
    heldout = heldout_dead_codes(model, c) if vq else []
    final, acc, seq_acc = evaluate(model, c["symbols"], c["length"])
    return TrainResult(method, seed, losses, final, acc, seq_acc, dead, heldout, reset, seconds, c,
                       model)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=DEFAULTS["steps"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--codes", type=int, default=DEFAULTS["codes"])
    p.add_argument("--method", choices=("both", "vq", "exact"), default="both")
    p.add_argument("--quick", action="store_true",
                   help="a short run: 150 steps (the copy is learnt, the loss not yet settled)")
    args = p.parse_args(argv)
    if args.quick:
        args.steps = 150
    methods = ("vq", "exact") if args.method == "both" else (args.method,)
    print(f"copy task: {DEFAULTS['symbols']} symbols, length {DEFAULTS['length']}; model "
          f"d_model={DEFAULTS['d_model']} heads={DEFAULTS['heads']} layers={DEFAULTS['layers']}; "
          f"VQ codes={args.codes} per head (EMA decay {DEFAULTS['decay']}, dead after "
          f"{DEFAULTS['dead_after']}, beta {DEFAULTS['beta']}); steps={args.steps}; "
          f"torch threads={torch.get_num_threads()}")
    print(f"seed {args.seed}  (rerun: --seed {args.seed} --steps {args.steps})", flush=True)
    results = [train(m, steps=args.steps, seed=args.seed, codes=args.codes) for m in methods]
    print_curves(results, args.steps)

    def note(r):
        extra = (f"\n        dead codes per layer (of {args.codes * DEFAULTS['heads']}): held-out "
                 f"{r.heldout_dead}, last training batch {r.dead_codes}; re-seeded during "
                 f"training {r.codes_reset}" if r.method == "vq" else "")
        return f"({r.seconds:.1f} s){extra}"

    print_heldout(results, DEFAULTS["symbols"], args.seed, note)


if __name__ == "__main__":
    main()
