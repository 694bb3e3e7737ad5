"""Where a hybrid conversion of SmolLM2-135M starts (issue 48, point 4): perplexity on
held-out text no calibration saw (examples/hf/corpus.py's python-packages) at 1024 and
4096 tokens, for window 64 + 4 sinks alone and every favor method with a feature weight as
its hybrid, ungated and gated (g = 1e-3); and the positive-fit hybrid after attention
transfer (favor.hf.transfer, 200 Adam steps a layer on 8 windows of 1024) with and without
window dropout, measured with the gate open (g = 1: the estimator transfer fitted).

    python examples/hf/smollm2/hybrid_start.py --out examples/hf/smollm2/results/hybrid_start.json

The rows "hedgehog hybrid (without the norm term)" in results/hybrid_start.json were
measured before hybrid hedgehog gained the hyperbolic norm term (favor.hf.methods; docs/hf.md,
"Hybrid attention"): this script now measures the map with it.

Transfer checkpoints go to --checkpoints (runs/hybrid_start/; a rerun resumes); rows already in --out are
kept. Deterministic (seed 0 draws every map).
"""
import argparse
import copy
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import smollm2  # noqa: E402

METHODS = ("favor", "dijiang", "hedgehog", "positive-fit")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--lengths", default="1024,4096")
    p.add_argument("--windows", type=int, default=2, help="windows of each length scored")
    p.add_argument("--transfer-steps", type=int, default=200)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--table", action="store_true", help="print --out's table and stop")
    p.add_argument("--checkpoints", default=os.path.join("runs", "hybrid_start"),
                   help="transfer checkpoints, a folder per setting (a rerun resumes)")
    args = p.parse_args()
    if args.table:
        with open(args.out) as f:
            print(table(json.load(f)))
        return
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    import favor.hf as fh
    import favor.hf.longrange as lr
    import corpus
    print(f"seed 0, torch threads {args.threads}", flush=True)
    original, tok = smollm2.load()
    c = corpus.build(tok, os.path.join("runs", "corpus"), progress=False)
    held = c.held_out("python-packages")
    lengths = tuple(int(x) for x in args.lengths.split(","))
    out = {"text": "python-packages (held out whole)", "windows": args.windows, "rows": {}}
    if os.path.exists(args.out):
        with open(args.out) as f:
            out["rows"] = json.load(f)["rows"]

    def row(name, model, **extra):
        if name in out["rows"]:
            return
        t = time.perf_counter()
        ppl = lr.perplexity(model, held, lengths=lengths, windows=args.windows)
        out["rows"][name] = {"perplexity": ppl, **extra,
                             "minutes": (time.perf_counter() - t) / 60}
        print(name, json.dumps(out["rows"][name]), flush=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)

    row("original", original)
    options = {"window": 64, "sinks": 4}
    model = copy.deepcopy(original)
    fh.convert(model, "window", **options)
    row("window + sinks", model)
    for method in METHODS:
        for gate in (None, 1e-3):
            name = f"{method} hybrid" + (", gated" if gate else "")
            if name in out["rows"]:
                continue
            model = copy.deepcopy(original)
            fh.convert(model, method, features=128, seed=0, gate=gate, **options)
            row(name, model)
    cal = c.calibration(1024, seed=0)
    batches = [cal[i][None] for i in range(8)]
    for dropout in (0.5, 0.0):
        name = f"positive-fit hybrid, after transfer (window dropout {dropout})"
        if name in out["rows"]:
            continue
        model = copy.deepcopy(original)
        fh.convert(model, "positive-fit", features=128, seed=0, **options)
        t = time.perf_counter()
        report = fh.transfer(model, batches, steps=args.transfer_steps,
                             window_dropout=dropout,
                             checkpoint=os.path.join(args.checkpoints, f"dropout{dropout}"))
        minutes = (time.perf_counter() - t) / 60
        row(name, model, error_before=[r["error_before"] for r in report],
            error_after=[r["error_after"] for r in report], transfer_minutes=minutes)
    print(table(json.loads(json.dumps(out))))  # (the keys as the file keeps them)


def table(out):
    """The markdown table of the rows (perplexity, and its ratio to the original's)."""
    rows = out["rows"]
    base = rows["original"]["perplexity"]
    lengths = list(base)
    lines = ["| model | " + " | ".join(f"ppl {n}" for n in lengths) + " |",
             "|---" * (len(lengths) + 1) + "|"]
    for name, r in rows.items():
        cells = [f"{r['perplexity'][n]:.2f} ({r['perplexity'][n] / base[n]:.3f}x)"
                 for n in lengths]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
