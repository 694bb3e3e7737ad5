"""What SmolLM2-135M's conversions carry from beyond their window (issue 48): favor.hf
.longrange's copy recall, passkey, perplexity and greedy agreement, with the memory of the
decoding state + caches at 8k tokens, on held-out text no calibration saw (third-party
Python docstrings, examples/hf/corpus.py's python-packages); and favor.hf.rank_layers'
choice of softmax layers for a conversion.

    python examples/hf/smollm2/longrange.py --out examples/hf/smollm2/results/longrange.json \
        --rank window --greedy 4 \
        --model "window + sinks=window" \
        --model "positive-fit hybrid=positive-fit" \
        --model "window + sinks, 1M=runs/win1m/adapter"

A --model is NAME=SPEC[+L1,L2,...]: SPEC a method converted as-is (window 64 + 4 sinks;
favor methods with 128 features, seed 0), or a train.py adapter folder; "+greedy:K" (or a
list of layers) puts those layers on softmax (the first K of the --rank search). The
original is always the first row. Prints a markdown table; --out keeps every figure.
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


def build(spec, original, layers=()):
    import favor.hf as fh
    if os.path.isdir(spec):
        model = fh.from_pretrained(spec, base=copy.deepcopy(original))
        if layers:  # these favor layers on softmax too (the adapter trained without them)
            from favor.hf.convert import softmax_attention
            impl = softmax_attention(model)
            plan = dict(model.config.favor)
            plan["softmax_layers"] = sorted(set(plan.get("softmax_layers", [])) | set(layers))
            plan["softmax_attention"] = plan.get("softmax_attention", impl)
            model.config.favor = plan
            for layer, module, _ in fh.cores(model):
                if layer in layers:
                    module.favor_softmax = plan["softmax_attention"]
        return model
    model = copy.deepcopy(original)
    options = {"window": 64, "sinks": 4}
    if spec != "window":
        options.update(features=128, seed=0)
    fh.convert(model, spec, softmax_layers=list(layers), **options)
    return model


def memory(model, ids, n):
    """Bytes of the decoding state + caches after a prompt of n tokens (float32)."""
    import favor.hf as fh
    import transformers
    cache = transformers.DynamicCache(config=model.config) \
        if not getattr(model.config, "favor", None) else fh.FavorCache()
    with torch.no_grad():
        model(input_ids=ids[:n][None], cache=cache, use_cache=True)
    return fh.cache_bytes(cache)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--model", action="append", default=[])
    p.add_argument("--rank", help="a method (SPEC) to rank the layers of with rank_layers")
    p.add_argument("--greedy", type=int, default=0)
    p.add_argument("--lengths", default="1024,4096")
    p.add_argument("--passkey-lengths", default="1024,4096")
    p.add_argument("--trials", type=int, default=1)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--memory-at", type=int, default=8192)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    import favor.hf as fh
    import favor.hf.longrange as lr
    import corpus
    print(f"seed {args.seed}, torch threads {args.threads}", flush=True)
    original, tok = smollm2.load()
    c = corpus.build(tok, os.path.join("runs", "corpus"), progress=False)
    ids = c.held_out("python-packages")
    ints = lambda s: tuple(int(x) for x in s.split(","))  # noqa: E731
    out = {"text": "python-packages (held out whole)", "tokens": ids.numel(), "seed": args.seed,
           "rows": {}}
    if os.path.exists(args.out):
        with open(args.out) as f:
            out = {**json.load(f), **{k: v for k, v in out.items() if k != "rows"}}
    if args.rank:
        student = build(args.rank, original)
        cal = c.calibration(1024, seed=args.seed)
        batches = [cal[i][None] for i in range(2)]
        recall = lr.copy_batches(ids, samples=2, seed=args.seed + 1)  # not the table's passages
        t = time.perf_counter()
        report = fh.rank_layers(student, original, batches, recall=recall, greedy=args.greedy)
        print(report, flush=True)
        out["rank"] = {"spec": args.rank, "by": report.by, "baseline": report.baseline,
                       "rows": report.rows, "greedy": report.greedy,
                       "minutes": (time.perf_counter() - t) / 60}
        del student
    rank = out.get("rank")
    kv_full = memory(original, ids, args.memory_at)
    for entry in ["original=original"] + args.model:
        name, spec = entry.split("=", 1)
        layers = ()
        if "+" in spec:
            spec, extra = spec.split("+", 1)
            if extra.startswith("greedy:"):
                layers = tuple(rank["greedy"][int(extra[7:]) - 1]["layers"])
            else:
                layers = ints(extra)
        model = original if spec == "original" else build(spec, original, layers)
        t = time.perf_counter()
        rows = lr.suite(model, tok, ids, reference=None if model is original else original,
                        lengths=ints(args.lengths), passkey_lengths=ints(args.passkey_lengths),
                        trials=args.trials, samples=args.samples, seed=args.seed)
        rows["memory_bytes"] = kv_full if model is original else memory(model, ids,
                                                                          args.memory_at)
        rows["memory_vs_original"] = rows["memory_bytes"] / kv_full
        rows["softmax_layers"] = list(layers)
        rows["minutes"] = (time.perf_counter() - t) / 60
        out["rows"][name] = rows
        print(name, json.dumps({k: v for k, v in rows.items() if k != "passkey"}), flush=True)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    out = json.loads(json.dumps(out))  # (the keys as the file keeps them)
    print(lr.table(out["rows"], reference="original"))
    for name, r in out["rows"].items():
        print(f"{name}: memory at {args.memory_at} tokens {r['memory_bytes'] / 2**20:.1f} MiB "
              f"({r['memory_vs_original']:.1%} of the original's key-value cache)")


if __name__ == "__main__":
    main()
