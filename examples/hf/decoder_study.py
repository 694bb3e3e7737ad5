"""The decoder half of docs/hf.md: the character Llama (examples/hf/char_llama) converted to
favor's linear attention with favor.hf, method by method, and what generation costs.

1. Accuracy: for each method, on a deep copy of the checkpoint: convert -> validation bits
   per character ("converted"); attention transfer (favor.hf.transfer) on calibration
   windows of the TRAIN split -> "transferred"; then the WHOLE model fine-tuned with
   char_llama.train (one cosine schedule over 20% of the original 1200 steps, evaluated at
   5% and at 20%). The control is the ORIGINAL model fine-tuned with the same recipe and
   the same batches (train's seed); "gap" is (bpc - control) / control after 20%.
2. Generation: the original (sdpa + DynamicCache) against FAVOR+ (256 features, FavorCache)
   at prompts of 1k, 4k and 16k characters of validation text, batch 1, greedy: prefill
   seconds, decode tokens/s, the cache's bytes after generation and the peak RSS growth
   (each setting in a fresh subprocess, resource.getrusage).

    python examples/hf/decoder_study.py --out runs/decoder_study --threads 2
    ... --quick --out /tmp/ds          # a smoke version (< 60 s)

Writes OUT/results.json, OUT/decoder_study.md (the two tables) and OUT/decoder_study.png.
results.json is rewritten after every finished item; with --resume a rerun skips what it
holds (same settings).
"""
import argparse
import copy
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import char_llama  # noqa: E402

# (row name, favor.hf method, options)
METHODS = [
    ("exact", "exact", {}),
    ("favor", "favor", dict(features=256, projection="orthogonal")),
    ("favor#", "favor#", dict(features=256)),
    ("dijiang", "dijiang", dict(features=256)),
    ("hedgehog", "hedgehog", dict(features=64)),
    ("positive-fit", "positive-fit", dict(features=128)),
    ("hedgehog+decay", "hedgehog", dict(features=64, decay=0.99, learn_decay=True)),
    ("vq", "vq", dict(codes=64)),
    # hybrid attention: exact softmax on the last 64 characters and 4 sinks, the estimator
    # beyond (hedgehog with a learned decay, the best plain row); the same window and sinks
    # alone (method 'window': the estimator removed)
    ("hedgehog+decay w=64 s=4", "hedgehog", dict(features=64, decay=0.99, learn_decay=True,
                                                 window=64, sinks=4)),
    ("window w=64 s=4", "window", dict(window=64, sinks=4)),
    # the same at a window of 8, which leaves this model's attention short of its mass
    ("hedgehog+decay w=8 s=4", "hedgehog", dict(features=64, decay=0.99, learn_decay=True,
                                                window=8, sinks=4)),
    ("window w=8 s=4", "window", dict(window=8, sinks=4)),
]
CONTROL = "original (control)"

FULL = dict(
    eval_count=64, eval_context=256,                   # bits_per_char (train's own eval)
    calib_windows=16, calib_context=256, calib_batch=4, calib_seed=1234,
    transfer_steps=200, transfer_lr=3e-2,
    ft_steps=240, ft_first=60, ft_lr=1e-3, ft_warmup=10, ft_final_lr=1e-4,
    ft_batch=32, ft_context=256, ft_seed=0,
    gen_contexts=[1024, 4096, 16320], gen_new=64, gen_runs=3, gen_runs_long=1,
    gen_long_from=16000, gen_features=256, gen_subprocess=True,
    methods=[m[0] for m in METHODS], finetune=[m[0] for m in METHODS if m[0] != "exact"],
)
QUICK = dict(
    FULL, eval_count=8, eval_context=64, calib_windows=2, calib_context=64, calib_batch=2,
    transfer_steps=5, ft_steps=4, ft_first=1, ft_warmup=1, ft_batch=4, ft_context=64,
    gen_contexts=[256, 512], gen_new=8, gen_runs=1, gen_runs_long=1, gen_subprocess=False,
    methods=["exact", "favor"], finetune=["favor"],
)


def log(msg):
    print(msg, flush=True)


# ----------------------------------------------------------------------------- accuracy

def bpc(model, data, s):
    return char_llama.bits_per_char(model, data, "val", context=s["eval_context"],
                                    count=s["eval_count"])


def calibration(data, s):
    """The same calibration batches for every method: windows of the train split."""
    gen = torch.Generator().manual_seed(s["calib_seed"])
    x, _ = data.batch("train", s["calib_windows"], s["calib_context"], gen)
    return [dict(input_ids=x[i:i + s["calib_batch"]],
                 attention_mask=torch.ones_like(x[i:i + s["calib_batch"]]))
            for i in range(0, len(x), s["calib_batch"])]


def finetune(model, data, s, progress):
    """One schedule over ft_steps (warmup, cosine), evaluated every ft_first steps; returns
    {step: val bpc} (the evaluation inside train uses eval_context and 64 windows)."""
    evals = char_llama.train(model, data, s["ft_steps"], lr=s["ft_lr"], warmup=s["ft_warmup"],
                             final_lr=s["ft_final_lr"], batch=s["ft_batch"],
                             context=s["ft_context"], seed=s["ft_seed"],
                             eval_every=s["ft_first"], log=log, progress=progress)
    return {int(k): v for k, v in evals}


def ft_bpc(evals, step):
    return evals.get(step, evals.get(str(step)))


def run_method(name, method, options, original, data, batches, s, do_ft, progress):
    import favor.hf as fh
    row = dict(method=name, favor_method=method, options=options)
    t0 = time.time()
    torch.manual_seed(0)
    model = copy.deepcopy(original)
    if method is None:  # the control
        row["converted"] = row["transferred"] = bpc(model, data, s)
    else:
        report = fh.convert(model, method, **options)
        log(str(report))
        try:
            row["converted"] = bpc(model, data, s)
        except Exception as e:  # a causal FAVOR#/++ layer runs only once fitted
            row["converted"], row["converted_error"] = None, f"{type(e).__name__}: {e}"
            log(f"{name}: converted model does not run before transfer: {e}")
        tt = time.time()
        rep = fh.transfer(model, batches, steps=s["transfer_steps"], lr=s["transfer_lr"],
                          progress=progress)
        row["transfer_s"] = round(time.time() - tt, 1)
        log(str(rep))
        row["transfer_report"] = [{k: v for k, v in r.items()} for r in rep]
        row["transferred"] = bpc(model, data, s)
    log(f"{name}: converted {_f(row['converted'])}, transferred {_f(row['transferred'])}")
    if do_ft:
        tf = time.time()
        evals = finetune(model, data, s, progress)
        row["ft_s"] = round(time.time() - tf, 1)
        row["ft_s_per_step"] = round(row["ft_s"] / s["ft_steps"], 3)
        row["ft_evals"] = evals
        row["ft_first"], row["ft_last"] = ft_bpc(evals, s["ft_first"]), ft_bpc(evals, s["ft_steps"])
        log(f"{name}: +{s['ft_first']} steps {_f(row['ft_first'])}, "
            f"+{s['ft_steps']} steps {_f(row['ft_last'])}")
    row["wall_s"] = round(time.time() - t0, 1)
    return row


# --------------------------------------------------------------------------- generation

def prompt_ids(data, n):
    ids = data.splits["val"]
    reps = -(-n // len(ids))
    return torch.cat([ids] * reps)[:n][None]


class _Clock:
    """A generate() streamer: the time of each put (the prompt first, then every token)."""

    def __init__(self):
        self.times = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass


def cache_bytes(cache):
    import favor.hf as fh
    if isinstance(cache, fh.FavorCache):
        return int(cache.state_bytes)
    total = 0
    for layer in cache.layers:
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total


def gen_setting(kind, context, s, threads):
    """One setting in this process: [{prefill_s, decode_tok_s, cache_bytes, rss}] per run."""
    import favor.hf as fh
    from transformers import DynamicCache
    torch.set_num_threads(threads)
    model, data = char_llama.load()
    if kind == "favor":
        fh.convert(model, "favor", features=s["gen_features"], projection="orthogonal")
    model.eval()
    new = s["gen_new"]
    kw = dict(do_sample=False, max_new_tokens=new + 1, min_new_tokens=new + 1,
              pad_token_id=0)

    def once(n):
        ids = prompt_ids(data, n)
        cache = fh.FavorCache() if kind == "favor" else DynamicCache(config=model.config)
        clock = _Clock()
        with torch.no_grad():
            t0 = time.perf_counter()
            out = model.generate(ids, attention_mask=torch.ones_like(ids), cache=cache,
                                 streamer=clock, **kw)
        t = clock.times  # [prompt, token 1 (from the prefill), token 2, ..., token new+1]
        assert out.shape[1] == n + new + 1, out.shape
        steps = [b - a for a, b in zip(t[1:-1], t[2:])]
        return dict(prefill_s=t[1] - t0, decode_tok_s=new / (t[-1] - t[1]),
                    step_ms_median=1e3 * statistics.median(steps), step_ms_max=1e3 * max(steps),
                    cache_bytes=cache_bytes(cache), seq_length=int(cache.get_seq_length()))

    once(64)  # warm-up
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    runs = s["gen_runs_long"] if context >= s["gen_long_from"] else s["gen_runs"]
    rows = []
    for i in range(runs):
        r = once(context)
        if i == 0:
            r["rss_growth_bytes"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                                     - base) * 1024
        rows.append(r)
    return rows


def gen_summary(kind, context, rows, subprocess_rss):
    return dict(model=kind, context=context, runs=len(rows),
                prefill_s=statistics.median(r["prefill_s"] for r in rows),
                decode_tok_s=statistics.median(r["decode_tok_s"] for r in rows),
                decode_tok_s_runs=[r["decode_tok_s"] for r in rows],
                step_ms_median=statistics.median(r["step_ms_median"] for r in rows),
                step_ms_max=max(r["step_ms_max"] for r in rows),
                cache_bytes=rows[0]["cache_bytes"], seq_length=rows[0]["seq_length"],
                rss_growth_bytes=rows[0]["rss_growth_bytes"] if subprocess_rss else None)


def run_generation(kind, context, s, threads):
    if not s["gen_subprocess"]:
        return gen_summary(kind, context, gen_setting(kind, context, s, threads), False)
    cmd = [sys.executable, os.path.abspath(__file__), "--gen-worker", kind, str(context),
           "--threads", str(threads), "--settings-json", json.dumps(s)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return gen_summary(kind, context, json.loads(line[len("RESULT "):]), True)


# ------------------------------------------------------------------------------ output

def _f(x, nd=3):
    return "n/a" if x is None else f"{x:.{nd}f}"


def _mib(b):
    if b is None:
        return "n/a"
    return f"{b / 2**20:.2f} MiB" if b >= 2**20 else f"{b / 2**10:.1f} KiB"


def accuracy_table(res):
    s = res["settings"]
    rows = res["accuracy"]
    control = rows.get(CONTROL, {}).get("ft_last")
    head = (f"| method | converted | transferred | +{s['ft_first']} steps FT | "
            f"+{s['ft_steps']} steps FT | gap to control after {s['ft_steps']} |")
    lines = [head, "|---|---|---|---|---|---|"]
    for name in [CONTROL] + [m[0] for m in METHODS]:
        r = rows.get(name)
        if r is None:
            continue
        gap = None
        if control and r.get("ft_last") is not None:
            gap = 100.0 * (r["ft_last"] - control) / control
        label = name + (f" ({_opts(r['options'])})" if r.get("options") else "")
        conv = _f(r["converted"]) if r["converted"] is not None else "does not run"
        lines.append(f"| {label} | {conv} | {_f(r['transferred'])} | {_f(r.get('ft_first'))} | "
                     f"{_f(r.get('ft_last'))} | "
                     f"{'n/a' if gap is None else f'{gap:+.2f}%'} |")
    return "\n".join(lines)


def _opts(o):
    return ", ".join(f"{k} {v}" for k, v in o.items())


def generation_table(res):
    lines = ["| model | prompt chars | prefill s | decode tok/s | cache after generation | "
             "peak RSS growth |", "|---|---|---|---|---|---|"]
    for r in res["generation"]:
        lines.append(f"| {r['model']} | {r['context']} | {r['prefill_s']:.3f} | "
                     f"{r['decode_tok_s']:.1f} | {_mib(r['cache_bytes'])} | "
                     f"{_mib(r['rss_growth_bytes'])} |")
    return "\n".join(lines)


def goal(res):
    s = res["settings"]
    rows = res["accuracy"]
    control = rows.get(CONTROL, {}).get("ft_last")
    done = [(r["ft_last"], n) for n, r in rows.items()
            if n not in (CONTROL, "exact") and r.get("ft_last") is not None]
    if control is None or not done:
        return None
    best, name = min(done)
    gap = 100.0 * (best - control) / control
    return dict(best=name, best_bpc=best, control_bpc=control, gap_percent=gap,
                met=gap <= 1.0, steps=s["ft_steps"])


def write_outputs(res, out):
    os.makedirs(out, exist_ok=True)
    res["goal"] = goal(res)
    tmp = os.path.join(out, "results.json.tmp")
    with open(tmp, "w") as f:
        json.dump(res, f, indent=2)
    os.replace(tmp, os.path.join(out, "results.json"))
    md = ["## Accuracy (validation bits per character)", "", accuracy_table(res), ""]
    g = res["goal"]
    if g:
        md += [f"Goal (best method within 1% of the control after {g['steps']} steps): "
               f"{'met' if g['met'] else 'not met'}: {g['best']} {g['best_bpc']:.3f} vs "
               f"control {g['control_bpc']:.3f} ({g['gap_percent']:+.2f}%).", ""]
    if res.get("generation"):
        md += ["## Generation (batch 1, greedy)", "", generation_table(res), ""]
    with open(os.path.join(out, "decoder_study.md"), "w") as f:
        f.write("\n".join(md))
    plot(res, os.path.join(out, "decoder_study.png"))


def _have_matplotlib():
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:  # the hf extra brings it; without it, the tables are the results
        return False


def plot(res, path):
    if not _have_matplotlib():
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    s = res["settings"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    ax = axes[0]
    stages = ["converted", "transferred", "ft_first", "ft_last"]
    labels = ["converted", "transferred", f"+{s['ft_first']} FT", f"+{s['ft_steps']} FT"]
    for name, r in res["accuracy"].items():
        ys = [r.get(k) for k in stages]
        xs = [i for i, y in enumerate(ys) if y is not None]
        ax.plot(xs, [ys[i] for i in xs], marker="o", label=name,
                linestyle="--" if name == CONTROL else "-")
    ax.set_xticks(range(4), labels)
    ax.set_ylabel("val bits per character")
    ax.set_yscale("log")
    ax.set_title("accuracy per method and stage")
    ax.legend(fontsize=7)
    gen = res.get("generation") or []
    for kind in ("original", "favor"):
        rows = [r for r in gen if r["model"] == kind]
        if not rows:
            continue
        label = "original (sdpa, KV cache)" if kind == "original" else "FAVOR+ (FavorCache)"
        axes[1].plot([r["context"] for r in rows], [r["decode_tok_s"] for r in rows],
                     marker="o", label=label)
        axes[2].plot([r["context"] for r in rows], [r["cache_bytes"] / 2**20 for r in rows],
                     marker="o", label=label)
    for ax, yl, t in ((axes[1], "decode tokens/s", "decode speed"),
                      (axes[2], "cache after generation (MiB)", "cache memory")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("prompt characters")
        ax.set_ylabel(yl)
        ax.set_title(t)
        if gen:
            ax.legend(fontsize=8)
    axes[2].set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -------------------------------------------------------------------------------- main

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="runs/decoder_study")
    p.add_argument("--quick", action="store_true", help="smoke version (< 60 s)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--methods", default=None, help="comma-separated rows (default: all)")
    p.add_argument("--finetune", default=None,
                   help="comma-separated rows to fine-tune (default: all but exact; 'none')")
    p.add_argument("--no-control", action="store_true", help="skip the fine-tuned control")
    p.add_argument("--skip-accuracy", action="store_true")
    p.add_argument("--skip-generation", action="store_true")
    p.add_argument("--resume", action="store_true", help="keep OUT/results.json's rows")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--gen-worker", nargs=2, metavar=("KIND", "CONTEXT"), help=argparse.SUPPRESS)
    p.add_argument("--settings-json", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)

    if a.gen_worker:
        s = json.loads(a.settings_json)
        rows = gen_setting(a.gen_worker[0], int(a.gen_worker[1]), s, a.threads)
        print("RESULT " + json.dumps(rows), flush=True)
        return

    torch.set_num_threads(a.threads)
    s = dict(QUICK if a.quick else FULL)
    if a.methods:
        s["methods"] = a.methods.split(",")
    if a.finetune:
        s["finetune"] = [] if a.finetune == "none" else a.finetune.split(",")
    progress = not a.no_progress
    t_start = time.time()
    log(f"decoder_study: {'quick' if a.quick else 'full'}, threads {a.threads}; seeds: "
        f"torch.manual_seed(0) before each conversion, favor.hf.convert seed 0 (layer i: i), "
        f"calibration torch.Generator seed {s['calib_seed']}, fine-tune batches seed "
        f"{s['ft_seed']} (the same for every method and the control)")
    log("settings: " + json.dumps({k: v for k, v in s.items()}))

    path = os.path.join(a.out, "results.json")
    res = dict(settings=s, accuracy={}, generation=[], threads=a.threads)
    if a.resume and os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        keys = [k for k in s if not k.startswith("gen_") and k not in ("methods", "finetune")]
        if all(old["settings"].get(k) == s[k] for k in keys):
            res["accuracy"] = old.get("accuracy", {})
            res["generation"] = old.get("generation", [])
            res["wall_s_before"] = old.get("wall_s", 0) + old.get("wall_s_before", 0)
            log(f"resume: {list(res['accuracy'])} from {path}")
        else:
            log("resume: settings differ, starting afresh")

    if not a.skip_accuracy:
        original, data = char_llama.load()
        original_bpc = bpc(original, data, s)
        res["original_bpc"] = original_bpc
        log(f"original: val bpc {original_bpc:.4f} ({s['eval_count']} windows of "
            f"{s['eval_context']} chars)")
        batches = calibration(data, s)
        todo = [] if a.no_control else [(CONTROL, None, {})]
        spec = {m[0]: m for m in METHODS}
        unknown = [m for m in s["methods"] if m not in spec]
        if unknown:
            p.error(f"--methods: unknown {unknown}; rows: {', '.join(spec)}")
        todo += [spec[m] for m in s["methods"]]  # in the order given
        for name, method, options in todo:
            do_ft = name == CONTROL or name in s["finetune"]
            old = res["accuracy"].get(name)
            if old is not None and (not do_ft or old.get("ft_last") is not None):
                log(f"{name}: kept from {path}")
                continue
            log(f"=== {name} ===")
            res["accuracy"][name] = run_method(name, method, options, original, data, batches,
                                               s, do_ft, progress)
            res["wall_s"] = round(time.time() - t_start, 1)
            write_outputs(res, a.out)

    if not a.skip_generation:
        res["generation"] = []
        for context in s["gen_contexts"]:
            for kind in ("original", "favor"):
                log(f"=== generation: {kind}, {context} characters ===")
                r = run_generation(kind, context, s, a.threads)
                log(f"  prefill {r['prefill_s']:.3f} s, decode {r['decode_tok_s']:.1f} tok/s, "
                    f"cache {_mib(r['cache_bytes'])}, RSS growth {_mib(r['rss_growth_bytes'])}")
                res["generation"].append(r)
                res["wall_s"] = round(time.time() - t_start, 1)
                write_outputs(res, a.out)

    res["wall_s"] = round(time.time() - t_start, 1)
    write_outputs(res, a.out)
    log("")
    with open(os.path.join(a.out, "decoder_study.md")) as f:
        log(f.read())
    png = ", decoder_study.png" if _have_matplotlib() \
        else " (matplotlib is not installed: no plot; pip install matplotlib)"
    log(f"wall time {res['wall_s']:.0f} s; wrote {a.out}/results.json, decoder_study.md{png}")
    return res


if __name__ == "__main__":
    main()
