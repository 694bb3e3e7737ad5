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
original is always the first row. Perplexity and passkey at 1k, 4k and 8k by default.

Memory, two figures a row: the decoding state + caches after an 8k prompt (fh.cache_bytes),
and the process's (--rss-new: each model alone in a fresh process, generate() on the 8k
prompt; the peak resident set above the loaded model's, and what stays held after).
--process-only re-measures that figure alone for the rows already in --out;
--process-lengths 1024,2048,4096,8192 measures it alone at each prompt length (issue 49),
--rss-repeats R times each (the median run); every model's weights are read in before the
baseline (the original's cached load maps them: they would count as its growth), and
--rss-warm K makes a short generate() first, so that what any first call costs counts as
loading:

    python examples/hf/smollm2/longrange.py --out examples/hf/smollm2/results/memory.json \
        --process-lengths 1024,2048,4096,8192 --model "positive-fit hybrid=positive-fit" \
        --model "shipped plan=examples/hf/smollm2/gated-hybrid-4-softmax"

Prints a markdown table; --out keeps every figure.
"""
import argparse
import copy
import gc
import json
import os
import re
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import smollm2  # noqa: E402


def build(spec, original, layers=(), keep=True):
    """The model SPEC names (see the module docstring), on a copy of `original` (keep=True) or
    on `original` itself."""
    import favor.hf as fh
    if os.path.isdir(spec):
        model = fh.from_pretrained(spec, base=copy.deepcopy(original) if keep else original)
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
    model = copy.deepcopy(original) if keep else original
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


def _rss_kib(field):
    with open("/proc/self/status") as f:
        return int(re.search(field + r":\s+(\d+) kB", f.read()).group(1))


def _resident(model):
    """Reads every parameter and buffer of `model`, so that its weights are resident before the
    baseline: smollm2.load() maps its cached safetensors, whose pages are read in by the first
    forward, and the original's peak would count its own weights (515 MiB) as growth, where a
    conversion's copy has already read them."""
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            if t.numel():
                t.detach().reshape(-1).sum()


def rss_worker(spec, layers, n, new, threads, warm=0):
    """Process memory of one model in its own process (nothing else loaded): generate() on a
    prompt of n held-out tokens, `new` tokens. The peak resident set (VmHWM, reset after
    loading, the weights read in) above the loaded model's, and what generate() leaves held
    once its output is dropped (as the process holds it, and after malloc_trim: what is still
    allocated). warm > 0: a generate() of 2 tokens on the first `warm` tokens before the
    baseline, so that what a first call costs whatever the prompt (libraries' code, thread
    pools, BLAS buffers) counts as loading, for every model alike."""
    import corpus
    if warm >= n:
        raise SystemExit(f"--rss-warm: {warm} must be below the prompt's {n} tokens (the warm-up "
                         "call would allocate what the measured one does)")
    torch.set_num_threads(threads)
    original, tok = smollm2.load()
    model = original if spec == "original" else build(spec, original, layers, keep=False)
    del original
    _resident(model)
    ids = corpus.build(tok, os.path.join("runs", "corpus"), progress=False) \
        .held_out("python-packages")[:n][None]
    if warm:
        with torch.no_grad():
            model.generate(ids[:, :warm], attention_mask=torch.ones_like(ids[:, :warm]),
                           do_sample=False, max_new_tokens=2, min_new_tokens=2)
    gc.collect()
    import ctypes
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # what loading freed goes back: not counted
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := the current resident set
    loaded = _rss_kib("VmRSS")
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=new, min_new_tokens=new)
    assert out.shape[1] == n + new, out.shape
    del out
    gc.collect()
    held = _rss_kib("VmRSS")
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # what is still allocated, not only cached
    return {"loaded_bytes": loaded * 1024, "peak_bytes": _rss_kib("VmHWM") * 1024,
            "peak_growth_bytes": (_rss_kib("VmHWM") - loaded) * 1024,
            "held_bytes": (held - loaded) * 1024,
            "held_trimmed_bytes": (_rss_kib("VmRSS") - loaded) * 1024, "prompt": n,
            "new": new, "threads": threads, "warm": warm}


def rss(spec, layers, n, new, threads, warm=0):
    cmd = [sys.executable, os.path.abspath(__file__), "--out", os.devnull, "--rss-worker", spec,
           ",".join(map(str, layers)), str(n), str(new), str(threads), str(warm)]
    res = subprocess.run(cmd, check=True, capture_output=True, text=True)
    line = [x for x in res.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def memory_table(out):
    """--process-lengths' table: generate()'s peak resident set above the loaded model (and
    what it holds after) per prompt length, a row a model, and each as a share of the
    original's peak at that length; with repeats the median run, [the range of the peaks]."""
    sweep = out["process_lengths"]
    lengths = sorted({int(n) for r in sweep.values() for n in r})
    base = sweep.get("original", {})
    head = ["model"] + [f"{n // 1024}k: peak (held)" for n in lengths]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for name, r in sweep.items():
        cells = [name]
        for n in lengths:
            p = r.get(str(n))
            if p is None:
                cells.append("-")
                continue
            share = (f", {p['peak_growth_bytes'] / base[str(n)]['peak_growth_bytes']:.2f}x"
                     if name != "original" and str(n) in base else "")
            spread = p.get("runs_peak_growth_bytes", [])
            spread = (f" [{min(spread) / 2**20:.0f}-{max(spread) / 2**20:.0f}]"
                      if len(spread) > 1 else "")
            cells.append(f"+{p['peak_growth_bytes'] / 2**20:.0f} MiB{spread}{share} "
                         f"(+{p['held_bytes'] / 2**20:.0f} MiB)")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def study_table(out):
    """The study's markdown table: every suite figure with both memories, a row a model."""
    rows = out["rows"]
    first = next(iter(rows.values()))
    keys, ppls = list(first["passkey"]["overall"]), list(first["perplexity"])
    base = rows.get("original")
    head = (["model", "softmax layers", "copy recall (2nd reading, nats)",
             "passkey " + " / ".join(f"{int(n) / 1024:g}k" for n in keys) + " (digit nats)"]
            + [f"ppl {n}" for n in ppls]
            + ["agreement", f"state + caches at {out.get('memory_at', 8192) // 1024}k",
               "generate() peak RSS (held after)"])
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for name, r in rows.items():
        copy_ = r["copy"]
        recall = "100%" if r is base else f"{copy_.get('recovered', float('nan')):.0%}"
        nats = r["passkey"].get("nats", {})
        key = " / ".join(f"{r['passkey']['overall'][n]:.0%}" for n in keys)
        if nats:
            key += " (" + " / ".join(f"{nats[n]['rest']:.2f}" for n in keys) + ")"
        ppl = [f"{r['perplexity'][n]:.2f}" if r is base or base is None
               else f"{r['perplexity'][n] / base['perplexity'][n]:.3f}x" for n in ppls]
        proc = r.get("process")
        rss = (f"+{proc['peak_growth_bytes'] / 2**30:.2f} GiB (+{proc['held_bytes'] / 2**20:.0f}"
               " MiB)") if proc else ""
        cells = ([name, ", ".join(map(str, r.get("softmax_layers", []))) or "-",
                  f"{recall} ({copy_['second']:.2f})", key] + ppl
                 + [f"{r['agreement']:.1%}" if "agreement" in r else "",
                    f"{r['memory_bytes'] / 2**20:.1f} MiB ({r['memory_vs_original']:.1%})", rss])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--model", action="append", default=[])
    p.add_argument("--rank", help="a method (SPEC) to rank the layers of with rank_layers")
    p.add_argument("--greedy", type=int, default=0)
    p.add_argument("--lengths", default="1024,4096,8192")
    p.add_argument("--passkey-lengths", default="1024,4096,8192")
    p.add_argument("--trials", type=int, default=1)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--memory-at", type=int, default=8192)
    p.add_argument("--rss-new", type=int, default=16, help="tokens generate() makes after "
                   "the --memory-at prompt in the process-memory measure (0: skip it)")
    p.add_argument("--rss-worker", nargs=6, help=argparse.SUPPRESS)
    p.add_argument("--rss-warm", type=int, default=0, help="K: before the process-memory "
                   "baseline, a generate() on the prompt's first K tokens (what a first call "
                   "costs whatever the prompt counts as loading; 0: none)")
    p.add_argument("--process-lengths", help="LENGTHS: only generate()'s process memory of the "
                   "original and each --model at each prompt length (comma-separated), into "
                   "--out's process_lengths; --table then prints them")
    p.add_argument("--process-only", action="store_true",
                   help="re-measure only the process memory (--rss-new) of the rows already "
                        "in --out (the original and each --model), keeping their other figures")
    p.add_argument("--rss-repeats", type=int, default=1, help="R: --process-lengths measures "
                   "every cell R times (rounds of every model and length in turn) and keeps the "
                   "median run, the lower middle one for an even R (the table: the median, and "
                   "the range when R > 1)")
    p.add_argument("--table", action="store_true", help="print --out's table and stop")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.rss_worker:
        spec, layers, n, new, threads, warm = args.rss_worker
        layers = tuple(int(x) for x in layers.split(",") if x)
        print("RESULT " + json.dumps(rss_worker(spec, layers, int(n), int(new), int(threads),
                                                int(warm))))
        return
    if args.table:
        with open(args.out) as f:
            out = json.load(f)
        print(study_table(out) if "rows" in out and out["rows"] else memory_table(out))
        return
    lengths = [int(x) for x in args.process_lengths.split(",")] if args.process_lengths \
        else [args.memory_at]
    if args.rss_warm and args.rss_warm >= min(lengths):  # before any worker starts
        p.error(f"--rss-warm: {args.rss_warm} must be below every prompt length "
                f"({min(lengths)})")
    if args.process_lengths:
        out = {}
        if os.path.exists(args.out):
            with open(args.out) as f:
                out = json.load(f)
        sweep = out.setdefault("process_lengths", {})
        out.update(new=args.rss_new, threads=args.threads, warm=args.rss_warm,
                   repeats=args.rss_repeats, text="python-packages (held out)")
        models = [entry.split("=", 1) for entry in ["original=original"] + args.model]
        runs = {}
        # rounds of every model at every length in turn, so that the machine's drift falls on
        # all of them alike; each cell keeps its median run and every run's peak
        for k in range(args.rss_repeats):
            for n in (int(x) for x in args.process_lengths.split(",")):
                for name, spec in models:
                    r = rss(spec, (), n, args.rss_new, args.threads, args.rss_warm)
                    cell = runs.setdefault((name, n), [])
                    cell.append(r)
                    cell.sort(key=lambda x: x["peak_growth_bytes"])
                    median = dict(cell[(len(cell) - 1) // 2])
                    median["runs_peak_growth_bytes"] = [x["peak_growth_bytes"] for x in cell]
                    sweep.setdefault(name, {})[str(n)] = median
                    print(f"round {k + 1}", name, n, json.dumps(r), flush=True)
                    with open(args.out, "w") as f:
                        json.dump(out, f, indent=1)
        print(memory_table(out))
        return
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
           "memory_at": args.memory_at, "rows": {}}
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
    if args.process_only:
        for entry in ["original=original"] + args.model:
            name, spec = entry.split("=", 1)
            spec, layers = (spec.split("+", 1)[0], ints(spec.split("+", 1)[1])) \
                if "+" in spec and not spec.split("+", 1)[1].startswith("greedy:") else (spec, ())
            if name not in out["rows"]:
                raise SystemExit(f"--process-only: no row {name!r} in {args.out}")
            out["rows"][name]["process"] = rss(spec, layers, args.memory_at, args.rss_new,
                                               args.threads, args.rss_warm)
            print(name, json.dumps(out["rows"][name]["process"]), flush=True)
            with open(args.out, "w") as f:
                json.dump(out, f, indent=1)
        print(study_table(json.loads(json.dumps(out))))
        return
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
        rows["softmax_layers"] = sorted(getattr(model.config, "favor", None) and
                                        model.config.favor.get("softmax_layers") or [])
        if args.rss_new:
            rows["process"] = rss(spec, layers, args.memory_at, args.rss_new, args.threads,
                                  args.rss_warm)
        rows["minutes"] = (time.perf_counter() - t) / 60
        out["rows"][name] = rows
        print(name, json.dumps({k: v for k, v in rows.items() if k != "passkey"}), flush=True)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    out = json.loads(json.dumps(out))  # (the keys as the file keeps them)
    print(study_table(out))
    for name, r in out["rows"].items():
        line = (f"{name}: memory at {args.memory_at} tokens {r['memory_bytes'] / 2**20:.1f} "
                f"MiB ({r['memory_vs_original']:.1%} of the original's key-value cache)")
        if "process" in r:
            line += (f"; generate(): peak RSS +{r['process']['peak_growth_bytes'] / 2**30:.2f}"
                     f" GiB over the loaded model, +{r['process']['held_bytes'] / 2**20:.0f}"
                     " MiB held after")
        print(line)


if __name__ == "__main__":
    main()
