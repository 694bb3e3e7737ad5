"""The SmolLM2 study: SmolLM2-135M-Instruct (smollm2.py) converted to every favor method,
plain and hybrid, on held-out text (the standard library's held-out docstrings), before and
after training (train.py's runs). Three sections, each saved in OUT/study.json as it ends
(a rerun skips what is there; --redo SECTION runs one again):

- ppl: perplexity at 1024 and 4096 tokens (consecutive held-out windows) of the original,
  favor's exact attention, every method as converted (plain, and hybrid w = 64, s = 4), the
  window and sinks alone (StreamingLLM's attention), and the trained runs;
- greedy: 64 greedy tokens from held-out prompts; agreement with the original's tokens
  (position by position) and the length of the agreeing prefix;
- generate: prompts of 1k, 4k and 8k tokens at batch 1, 1k and 4k at batch 8 (--generate),
  each in its own process:
  prefill seconds, decode tokens/s, state or cache bytes and peak RSS, the shipped favor
  conversion against the original's KV cache (sdpa).

    python examples/hf/smollm2/study.py --out examples/hf/smollm2/results \
        --trained "positive-fit hybrid=runs/pf" --trained "window=runs/win" --ship runs/pf/adapter

Writes OUT/study.md (the tables) and OUT/smollm2.png. Seeds: every conversion uses seed 0.
"""
import argparse
import copy
import json
import math
import os
import resource
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import smollm2  # noqa: E402

HYBRID = dict(window=64, sinks=4)
# every method, at 128 features a head (hedgehog: 64 projections, two halves), seed 0
METHODS = [("favor", dict(features=128)), ("favor++", dict(features=128)),
           ("favor#", dict(features=128)), ("dijiang", dict(features=128)),
           ("hedgehog", dict(features=64)), ("positive-fit", dict(features=128)),
           ("vq", dict(codes=256))]


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def perplexity(model, windows):
    nll, count = 0.0, 0
    with torch.no_grad():
        for row in windows.split(1):
            loss = model(input_ids=row, labels=row, use_cache=False).loss
            nll += float(loss) * (row.shape[1] - 1)
            count += row.shape[1] - 1
    return math.exp(nll / count)


def converted(original, method, options, cal):
    import favor.hf as fh
    model = copy.deepcopy(original)
    fh.convert(model, method, **options)
    if fh.FavorConfig.of(model).record.fits in ("kernel", "codebook"):
        # FAVOR++ / FAVOR#'s fit and vq's codebooks come from calibration text (no steps)
        fh.transfer(model, [cal[:1]], steps=0, progress=False)
    return model


def trained(original, run, stage):
    """A train.py run's model after `stage`: 'transfer' (its transferred adapter) or
    'distill' (its final adapter)."""
    import favor.hf as fh
    path = os.path.join(run, "transferred" if stage == "transfer" else "adapter")
    return fh.from_pretrained(path, base=copy.deepcopy(original))


def models(original, cal, trained_runs, methods=None):
    """(label, kind, build) of every row of the ppl section (methods: names of METHODS to
    run; None: all)."""
    rows = [("original (sdpa)", "original", lambda: original),
            ("exact", "exact", lambda: converted(original, "exact", {}, cal))]
    for method, options in METHODS:
        if methods is not None and method not in methods:
            continue
        rows.append((method, "plain", lambda m=method, o=options: converted(original, m, o, cal)))
        if method == "vq":  # Transformer-VQ is exact on its quantised keys: no hybrid form
            continue
        rows.append((f"{method} hybrid", "hybrid",
                     lambda m=method, o=options: converted(original, m, {**o, **HYBRID}, cal)))
    rows.append(("window + sinks", "window",
                 lambda: converted(original, "window", HYBRID, cal)))
    for label, run in trained_runs:
        for stage in ("transfer", "distill"):
            if os.path.isdir(os.path.join(run, "transferred" if stage == "transfer"
                                          else "adapter")):
                rows.append((f"{label}, after {stage}", stage,
                             lambda r=run, s=stage: trained(original, r, s)))
    return rows


def section_ppl(original, cal, held, trained_runs, done, counts=(8, 2), methods=None):
    w1k, w4k = smollm2.windows(held, 1024, counts[0]), smollm2.windows(held, 4096, counts[1])
    out = done.get("ppl", [])
    have = {r["model"] for r in out}
    for label, kind, build in models(original, cal, trained_runs, methods):
        if label in have:
            continue
        t = time.perf_counter()
        model = build()
        row = {"model": label, "kind": kind, "ppl_1024": perplexity(model, w1k),
               "ppl_4096": perplexity(model, w4k), "seconds": 0.0}
        row["seconds"] = time.perf_counter() - t
        log(f"ppl {label}: {row['ppl_1024']:.3f} at 1024, {row['ppl_4096']:.3f} at 4096 "
            f"({row['seconds']:.0f} s)")
        out.append(row)
        yield out


def greedy(model, prompts, new):
    with torch.no_grad():
        return model.generate(prompts, attention_mask=torch.ones_like(prompts),
                              max_new_tokens=new, min_new_tokens=new,
                              do_sample=False)[:, prompts.shape[1]:]


def section_greedy(original, cal, held, trained_runs, done, new=64):
    prompts = smollm2.windows(held, 512, 4, offset=8192)
    ref = greedy(original, prompts, new)
    out = done.get("greedy", [])
    have = {r["model"] for r in out}
    keep = ("exact", "window", "transfer", "distill")
    for label, kind, build in models(original, cal, trained_runs):
        if label in have or kind not in keep:
            continue
        got = greedy(build(), prompts, new)
        same = got == ref
        prefix = [int(row.cumprod(0).sum()) for row in same]
        out.append({"model": label, "agreement": float(same.float().mean()),
                    "prefix": sum(prefix) / len(prefix), "prefixes": prefix, "new": new,
                    "prompts": list(prompts.shape)})
        log(f"greedy {label}: agreement {out[-1]['agreement']:.3f}, prefix {prefix}")
        yield out


def gen_worker(kind, prompt, batch, new, ship, threads, out, layers=None):
    """One generation setting in this process (its peak RSS is this setting's)."""
    import favor.hf as fh
    from decoder_study import _Clock, cache_bytes
    from transformers import DynamicCache
    torch.set_num_threads(threads)
    original, tok = smollm2.load(layers)
    model = original
    if kind == "favor":  # the adapters merged for inference: one matmul per projection
        model = fh.merge_adapters(fh.from_pretrained(ship, base=original))
    held = torch.load(os.path.join(out, "held_ids.pt"))
    ids = torch.cat([held] * (-(-(prompt + 997 * batch) // held.numel())))
    ids = torch.stack([ids[997 * b:997 * b + prompt] for b in range(batch)])
    cache = fh.FavorCache() if kind == "favor" else DynamicCache(config=model.config)
    clock = _Clock()
    import gc
    import psutil
    gc.collect()
    me = psutil.Process()
    before = me.memory_info().rss
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with torch.no_grad():
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), cache=cache,
                             streamer=clock, do_sample=False, max_new_tokens=new + 1,
                             min_new_tokens=new + 1)
    t = clock.times
    assert out.shape[1] == prompt + new + 1, out.shape
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    held = me.memory_info().rss - before  # with the cache or state still alive
    return dict(rss_held_bytes=held, model=kind, prompt=prompt, batch=batch, new=new, prefill_s=t[1] - t0,
                decode_tok_s=batch * new / (t[-1] - t[1]), cache_bytes=cache_bytes(cache),
                rss_peak_bytes=peak * 1024, rss_growth_bytes=(peak - base) * 1024,
                threads=threads)


def section_generate(args, done):
    out = done.get("generate", [])
    have = {(r["model"], r["prompt"], r["batch"]) for r in out}
    for prompt, batch in args.generate:
        for kind in ("original", "favor"):
            if (kind, prompt, batch) in have:
                continue
            cmd = [sys.executable, os.path.abspath(__file__), "--gen-worker", kind,
                   str(prompt), str(batch), "--new", str(args.new), "--ship", args.ship,
                   "--threads", str(args.threads), "--out", args.out]
            if args.layers:
                cmd += ["--layers", str(args.layers)]
            res = subprocess.run(cmd, check=True, capture_output=True, text=True)
            line = [x for x in res.stdout.splitlines() if x.startswith("RESULT ")][-1]
            out.append(json.loads(line[len("RESULT "):]))
            r = out[-1]
            log(f"generate {kind} prompt {prompt} batch {batch}: prefill {r['prefill_s']:.2f} s, "
                f"decode {r['decode_tok_s']:.1f} tok/s, cache {r['cache_bytes'] / 2**20:.1f} MiB, "
                f"peak RSS {r['rss_peak_bytes'] / 2**30:.2f} GiB")
            yield out


def tables(res):
    lines = ["| model | ppl @1024 | vs original | ppl @4096 | vs original |", "|---|---|---|---|---|"]
    ppl = res.get("ppl", [])
    base = next((r for r in ppl if r["kind"] == "original"), None)
    for r in ppl:
        rel = (lambda k: f"{r[k] / base[k]:.3f}x") if base else (lambda k: "")
        lines.append(f"| {r['model']} | {r['ppl_1024']:.3f} | {rel('ppl_1024')} | "
                     f"{r['ppl_4096']:.3f} | {rel('ppl_4096')} |")
    if res.get("greedy"):
        lines += ["", "| model | greedy agreement (64 new tokens, 4 prompts) | agreeing prefix |",
                  "|---|---|---|"]
        lines += [f"| {r['model']} | {r['agreement']:.3f} | {r['prefix']:.1f} |"
                  for r in res["greedy"]]
    if res.get("generate"):
        lines += ["", "| model | prompt | batch | prefill s | decode tok/s | state / cache MiB | "
                  "peak RSS GiB | RSS held after generate() MiB |", "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['model']} | {r['prompt']} | {r['batch']} | {r['prefill_s']:.2f} | "
                  f"{r['decode_tok_s']:.1f} | {r['cache_bytes'] / 2**20:.2f} | "
                  f"{r['rss_peak_bytes'] / 2**30:.2f} | {r['rss_held_bytes'] / 2**20:.0f} |"
                  for r in res["generate"]]
    return "\n".join(lines) + "\n"


def plot(res, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5))
    ppl = res.get("ppl", [])
    if ppl:
        ax = axes[0]
        names = [r["model"] for r in ppl]
        y = range(len(ppl))
        ax.barh([i - 0.2 for i in y], [r["ppl_1024"] for r in ppl], 0.4, label="1024 tokens")
        ax.barh([i + 0.2 for i in y], [r["ppl_4096"] for r in ppl], 0.4, label="4096 tokens")
        ax.set_yticks(list(y), names, fontsize=7)
        ax.invert_yaxis()
        ax.set_xscale("log")
        base = ppl[0]["ppl_1024"]
        ax.axvline(base, color="k", lw=0.8)
        ax.axvline(1.05 * base, color="k", lw=0.8, ls="--")
        ax.set_xlabel("held-out perplexity (log; line: original, dashed: 1.05x)")
        ax.legend(fontsize=8)
    gen = res.get("generate", [])
    if gen:
        ax = axes[1]
        for kind, style in (("original", "o-"), ("favor", "s-")):
            for batch in sorted({r["batch"] for r in gen}):
                rows = sorted((r for r in gen if r["model"] == kind and r["batch"] == batch),
                              key=lambda r: r["prompt"])
                if rows:
                    ax.plot([r["prompt"] for r in rows], [r["decode_tok_s"] for r in rows],
                            style, label=f"{'KV cache (sdpa)' if kind == 'original' else 'favor state'}, batch {batch}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel("decode tokens/s")
        ax.legend(fontsize=8)
    fig.suptitle("SmolLM2-135M-Instruct on favor (held-out stdlib docstrings)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _setting(text):
    prompt, batch = text.lower().split("x")
    return int(prompt), int(batch)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--trained", action="append", default=[],
                    help="LABEL=RUN: a train.py run folder (its transferred/ and adapter/)")
    ap.add_argument("--ship", help="the adapter the generate section runs")
    ap.add_argument("--sections", default="ppl,greedy,generate")
    ap.add_argument("--redo", action="append", default=[])
    ap.add_argument("--generate", type=_setting, nargs="+",
                    default=[(1024, 1), (4096, 1), (8192, 1), (1024, 8), (4096, 8)],
                    help="PROMPTxBATCH settings of the generate section")
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--ppl-windows", type=int, nargs=2, default=[8, 2],
                    help="held-out windows of 1024 and of 4096 tokens")
    ap.add_argument("--layers", type=int, help="the first LAYERS layers only (a quick check)")
    ap.add_argument("--methods", help="comma-separated methods of the ppl section (default all)")
    ap.add_argument("--gen-worker", nargs=3, metavar=("KIND", "PROMPT", "BATCH"))
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 2 layers, one window each, one small generate setting")
    args = ap.parse_args(argv)
    if args.quick:
        args.layers, args.ppl_windows, args.generate, args.new = 2, [1, 1], [(512, 1)], 4
        args.methods = "favor,positive-fit"
    if args.gen_worker:
        kind, prompt, batch = args.gen_worker
        r = gen_worker(kind, int(prompt), int(batch), args.new, args.ship, args.threads,
                       args.out, args.layers)
        print("RESULT " + json.dumps(r), flush=True)
        return
    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "study.json")
    res = json.load(open(path)) if os.path.exists(path) else {}
    for name in args.redo:
        res.pop(name, None)
    log(f"seed 0, torch threads {torch.get_num_threads()}")
    original, tok = smollm2.load(args.layers)
    cal, held = smollm2.token_text(tok)
    torch.save(held, os.path.join(args.out, "held_ids.pt"))  # for the generate workers
    cal = smollm2.windows(cal, 1024, 1)
    runs = [tuple(t.split("=", 1)) for t in args.trained]
    methods = None if not args.methods else args.methods.split(",")
    sections = {"ppl": lambda: section_ppl(original, cal, held, runs, res, args.ppl_windows,
                                           methods),
                "greedy": lambda: section_greedy(original, cal, held, runs, res),
                "generate": lambda: section_generate(args, res)}
    for name in args.sections.split(","):
        if name == "generate" and not args.ship:
            raise SystemExit("--ship: the adapter the generate section runs")
        for rows in sections[name]():
            res[name] = rows
            with open(path + ".tmp", "w") as f:
                json.dump(res, f, indent=1)
            os.replace(path + ".tmp", path)
    with open(os.path.join(args.out, "study.md"), "w") as f:
        f.write(tables(res))
    plot(res, os.path.join(args.out, "smollm2.png"))
    print(tables(res))


if __name__ == "__main__":
    main()
