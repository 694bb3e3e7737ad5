"""Held-out KL to the original and perplexity, per domain of the calibration corpus
(examples/hf/corpus.py: each source's held-out tenth, and python-packages, the domain no
calibration saw), for the original SmolLM2-135M and any conversions beside each other: the
shipped adapters, train.py's runs (OUT/adapter), or a method as converted (untrained).

    python examples/hf/smollm2/domains.py --out examples/hf/smollm2/results/domains.json \
        --model "window + sinks (shipped)=examples/hf/smollm2/window-sinks" \
        --model "positive-fit hybrid, 1M=runs/pf1m/adapter" \
        --model "positive-fit hybrid, untrained=positive-fit"

The teacher's logits are computed once per window and shared by every model. Prints a
markdown table (KL in nats per token; perplexity as a ratio to the original's).
"""
import argparse
import copy
import json
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import smollm2  # noqa: E402


def build(spec, original):
    import favor.hf as fh
    if os.path.isdir(spec):
        return fh.from_pretrained(spec, base=copy.deepcopy(original))
    model = copy.deepcopy(original)
    options = {"window": 64, "sinks": 4}
    if spec != "window":
        options.update(features=128, seed=0)
    fh.convert(model, spec, **options)
    return model


def main():
    import corpus
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="a JSON file")
    ap.add_argument("--corpus", default="runs/corpus")
    ap.add_argument("--model", action="append", default=[], metavar="NAME=ADAPTER|METHOD")
    ap.add_argument("--windows", type=int, default=4, help="windows per domain")
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--quick", action="store_true", help="2 layers, 1 window of 128")
    args = ap.parse_args()
    layers = None
    if args.quick:
        layers, args.windows, args.length = 2, 1, 128
    original, tok = smollm2.load(layers)
    c = corpus.build(tok, args.corpus)
    models = {}
    for item in args.model:
        name, _, spec = item.partition("=")
        models[name] = build(spec, original)
    rows = {name: {} for name in ["original", *models]}
    for domain in c.meta["sources"]:
        ids = c.held_out(domain)
        n = min(args.windows, ids.numel() // args.length)
        if not n:
            continue
        sums = {name: [0.0, 0.0] for name in rows}  # [KL, NLL] summed over positions
        count = 0
        for w in smollm2.windows(ids, args.length, n).split(1):
            with torch.no_grad():
                t = original(input_ids=w, use_cache=False).logits[0].float().log_softmax(-1)
                for name in rows:
                    s = t if name == "original" else models[name](
                        input_ids=w, use_cache=False).logits[0].float().log_softmax(-1)
                    sums[name][0] += float((t.exp() * (t - s)).sum())
                    sums[name][1] -= float(s[:-1].gather(-1, w[0, 1:, None]).sum())
            count += w.shape[1]
        base = math.exp(sums["original"][1] / (count - n))
        for name, (kl, nll) in sums.items():
            ppl = math.exp(nll / (count - n))
            rows[name][domain] = {"kl": kl / count, "ppl": ppl, "ppl_ratio": ppl / base}
        print(f"{domain}: " + ", ".join(f"{k} {v[domain]['ppl_ratio']:.3f}x"
                                        for k, v in rows.items()), flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"windows": args.windows, "length": args.length, "rows": rows}, f, indent=1)
    domains = list(rows["original"])
    print("\n| model | " + " | ".join(domains) + " |\n|---|" + "---|" * len(domains))
    for name, r in rows.items():
        print(f"| {name} | " + " | ".join(
            f"{r[d]['ppl']:.2f}" if name == "original" else
            f"{r[d]['ppl_ratio']:.3f}x, KL {r[d]['kl']:.3f}" for d in domains) + " |")


if __name__ == "__main__":
    main()
