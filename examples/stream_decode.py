"""Generate tokens one at a time with FAVOR+'s streaming state, and check that it computes
exactly what the full causal forward pass computes.

A causal FAVOR+ transformer keeps, per layer and head, the sums S = sum_j phi(k_j) v_j^T
and z = sum_j phi(k_j): FavorAttention.decoder(batch) holds them and
FavorAttention.step(x, decoder) attends one new token to everything before it in
O(features * head_dim) per head, whatever the position, in a state of fixed size.

1. The copy model of train_copy.py, trained briefly: prefill the prompt x1..xL SEP with one
   step() call, then generate x1..xL greedily, one token per step; the logits of every
   position must equal those of the model's forward() on the generated sequence, and the
   copy must be right.
2. The same architecture with random weights (fixed seed) and room for many positions:
   generate a long sequence token by token, check the logits against forward() again,
   print tokens/s at the start and at the end of the sequence (constant: the cost does not
   grow with the position), and check that every decoder's state_bytes stays constant.

    PYTHONPATH=build/python python3 examples/stream_decode.py
    PYTHONPATH=build/python python3 examples/stream_decode.py --quick

The logits agree to float32 rounding: the stepwise path sums the same terms as the
blocked causal kernel in another order, so the difference is bounded by a few float32
ulps per accumulated term (the tolerance below is derived in logit_tolerance).
"""
import argparse
import pathlib
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from train_copy import CausalTransformer, copy_batch, train  # noqa: E402

EPS32 = torch.finfo(torch.float32).eps


def logit_tolerance(logits, positions):
    """The bound the stepwise and the full-forward logits must meet: the two paths add the
    same positions' terms in different orders, an error of at most ~positions * eps
    relative to the magnitudes summed (the classic bound for a recursive sum), carried to
    the logits by the layers after the attention; 4 * positions * eps * max|logit| allows
    a factor 4 for those layers (measured differences are 1-2 orders of magnitude below)."""
    return 4 * positions * EPS32 * logits.abs().max().item()


@torch.no_grad()
def generate(model, prompt, new_tokens, greedy=True, generator=None):
    """Prefill `prompt` [B, P] in one step() call, then generate `new_tokens` tokens one per
    step (greedy, or sampled with `generator`). Returns (tokens [B, P + new_tokens],
    logits [B, P + new_tokens - 1, V] of every position fed, state_bytes per layer after
    every step, seconds spent in the one-token steps of each chunk of the sequence)."""
    model.eval()
    decoders = model.decoders(prompt.shape[0])
    logits = [model.step(prompt, decoders, 0)]
    tokens = [prompt]
    state_bytes = [[d.state_bytes for d in decoders]]
    step_seconds = []
    position = prompt.shape[1]
    for i in range(new_tokens):
        last = logits[-1][:, -1]
        nxt = (last.argmax(-1) if greedy else
               torch.multinomial(torch.softmax(last, -1), 1, generator=generator)[:, 0])
        tokens.append(nxt[:, None])
        if i == new_tokens - 1:
            break  # the last token is generated, not fed
        t0 = time.perf_counter()
        logits.append(model.step(nxt[:, None], decoders, position))
        step_seconds.append(time.perf_counter() - t0)
        state_bytes.append([d.state_bytes for d in decoders])
        position += 1
    return torch.cat(tokens, 1), torch.cat(logits, 1), state_bytes, step_seconds


def check(model, tokens, logits, label):
    """Max |stepwise - forward| of the logits of every fed position, against the tolerance;
    returns (max difference, tolerance)."""
    with torch.no_grad():
        full = model(tokens[:, :logits.shape[1]])
    diff = (full - logits).abs().max().item()
    tol = logit_tolerance(full, logits.shape[1])
    verdict = "OK" if diff <= tol else "FAILED"
    print(f"{label}: max |step - forward| over {logits.shape[1]} positions = {diff:.3e} "
          f"(tolerance {tol:.3e}) {verdict}")
    return diff, tol


def constant_state(state_bytes, label):
    first = state_bytes[0]
    ok = all(s == first for s in state_bytes)
    print(f"{label}: state_bytes per layer {first} at every one of {len(state_bytes)} steps: "
          f"{'constant' if ok else 'CHANGED: ' + str(sorted({tuple(s) for s in state_bytes}))}")
    return ok


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-steps", type=int, default=None,
                   help="training steps of the copy model (default 300; --quick: 100)")
    p.add_argument("--length", type=int, default=None,
                   help="tokens generated with random weights (default 1024; --quick: 256)")
    p.add_argument("--batch", type=int, default=4, help="sequences generated side by side")
    p.add_argument("--quick", action="store_true", help="a short run (a smoke test)")
    args = p.parse_args(argv)
    train_steps = args.train_steps or (100 if args.quick else 300)
    length = args.length or (256 if args.quick else 1024)
    print(f"seed {args.seed}; torch threads={torch.get_num_threads()}")
    ok = True

    # 1. The copy model: prefill the prompt, generate the copy.
    r = train("favor", steps=train_steps, seed=args.seed)
    model, cfg = r.model, r.config
    g = torch.Generator().manual_seed(args.seed + 1)
    inputs, targets, _ = copy_batch(args.batch, cfg["symbols"], cfg["length"], g)
    prompt = inputs[:, :cfg["length"] + 1]                  # x1..xL SEP
    tokens, logits, state_bytes, _ = generate(model, prompt, cfg["length"])
    copied = (tokens[:, cfg["length"] + 1:] == inputs[:, :cfg["length"]]).float().mean().item()
    print(f"copy model ({train_steps} training steps, held-out loss {r.final_loss:.4f}): "
          f"prefill {prompt.shape[1]} tokens, generate {cfg['length']}; "
          f"copied tokens right: {100 * copied:.1f}%")
    diff, tol = check(model, tokens, logits, "copy model")
    ok &= diff <= tol
    ok &= constant_state(state_bytes, "copy model")

    # 2. Random weights, a long sequence, tokens/s along it.
    torch.manual_seed(args.seed)
    vocab = 64
    model = CausalTransformer(vocab, length + 1, cfg["d_model"], cfg["heads"], cfg["layers"],
                              features=cfg["features"], seed=args.seed).eval()
    prompt = torch.randint(0, vocab, (args.batch, 1), generator=g)
    tokens, logits, state_bytes, seconds = generate(model, prompt, length, greedy=False,
                                                    generator=g)
    diff, tol = check(model, tokens, logits, f"random weights, {length} tokens")
    ok &= diff <= tol
    ok &= constant_state(state_bytes, "random weights")
    chunk = max(1, len(seconds) // 8)
    first, last = sum(seconds[:chunk]), sum(seconds[-chunk:])
    total = sum(seconds)
    print(f"decode: {args.batch} sequences x {len(seconds)} one-token steps, "
          f"{cfg['layers']} layers, {cfg['heads']} heads, features {cfg['features']}: "
          f"{args.batch * len(seconds) / total:.0f} tokens/s "
          f"({1e3 * total / len(seconds):.3f} ms per step)")
    print(f"  positions 1-{chunk}: {args.batch * chunk / first:.0f} tokens/s;  positions "
          f"{len(seconds) - chunk + 1}-{len(seconds)}: {args.batch * chunk / last:.0f} tokens/s")
    with torch.no_grad():
        t0 = time.perf_counter()
        model(tokens[:, :length])
        full = time.perf_counter() - t0
    print(f"  for comparison, one forward() over all {length} positions: {1e3 * full:.2f} ms "
          "(what each new token would cost without the streaming state)")
    print("all checks passed" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
