"""The conversion study: the shipped exact-attention baseline converted to every favor method,
validation bits per character right after conversion and along a short fine-tune, and
FAVOR+ and Transformer-VQ trained from scratch with the baseline's budget.

    python examples/shakespeare/study.py --out runs/study
    ... --only favor-orth-256,hedgehog-128 --no-scratch      # a subset
    ... --table-only                                         # the table and plots from results
    ... --quick                                              # a smoke test, seconds

Every task (finetune:METHOD, scratch:METHOD) runs in its own process (--jobs at a time, each
with 2 // jobs torch threads: two one-thread processes step about 25% faster than one
two-thread process on this 2-core machine) and writes OUT/TASK.json and OUT/TASK.log; a
task whose JSON exists is skipped, so an interrupted study continues where it stopped
(scratch runs also resume from their checkpoints). At the end OUT/table.md and the plots
OUT/finetune.png and OUT/scratch.png are written from the JSON files.

Fine-tune: convert (favor.models.conversion.convert_method, fits on 16 training windows,
the learned maps checked on a quarter of them; "exact" is the control, the baseline itself
fine-tuned the same way), then AdamW at lr 1e-3 (20 warmup steps,
cosine to 1e-4) for 20% of the baseline's steps, batch as the baseline's; validation bpc
(--eval-windows fixed windows) at step 0 (right after conversion), at 5% of the baseline's
steps and at a few more points, the last at 20%. Scratch: the baseline's TrainConfig and
seed with the method's attention from the first step.

--quick is a smoke test of the command line: vq-64 only (fine-tuned and from scratch) unless
--only is given, 2 steps of batch 4 per task, 4 validation and 4 calibration windows, 10 Adam
steps per learned-map fit.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch

from common import DATA, HERE, QUICK, calibration, fit_options, setup
from favor.models import CharData, bits_per_char
from favor.models.char_transformer import CharTransformer
from favor.models.conversion import convert_method, parse_method
from favor.models.training import TrainConfig, Trainer, attention_preset, load_model

METHODS = ["exact", "favor-iid-64", "favor-iid-128", "favor-iid-256", "favor-orth-64",
           "favor-orth-128", "favor-orth-256", "favorpp-256", "favorsharp-256", "hedgehog-128",
           "positive-fit-256", "wpff-256", "vq-64"]
SCRATCH = ["favor-orth-256", "vq-64"]
BASELINE = os.path.join(HERE, "checkpoints", "exact.pt")
QUICK_METHODS, QUICK_STEPS = ["vq-64"], 2


def log(*args):
    print(*args, flush=True)


def load_data(a):
    """The text with the baseline's vocabulary (its checkpoint's `chars`)."""
    ck = torch.load(a.baseline, map_location="cpu", weights_only=False)
    return CharData.from_file(a.data, chars=ck.get("chars"))


def fine_tune(a, method, data):
    base, ck = load_model(a.baseline)
    steps0 = ck["train"]["steps"]
    budget = round(a.fine_tune * steps0)
    if a.quick:
        budget = min(budget, QUICK_STEPS)
    short = min(budget, round(0.05 * steps0))
    calib = calibration(data, base.context, a.seed, a.quick)
    torch.manual_seed(a.seed)
    t0 = time.time()
    model, info = convert_method(base, method, calib, seed=a.seed, verbose=True,
                                 **fit_options(a.quick))
    fit_seconds = time.time() - t0
    evaluate = lambda: bits_per_char(model, data, "val", count=a.eval_windows)
    curve = [(0, evaluate())]
    log(f"{method}: converted in {fit_seconds:.1f} s; step 0 val_bpc {curve[0][1]:.4f}")
    batch = min(ck["train"]["batch"], QUICK["batch"]) if a.quick else ck["train"]["batch"]
    config = TrainConfig(steps=budget, batch=batch, lr=a.lr, warmup=20,
                         min_lr=a.lr / 10, eval_every=budget, checkpoint_every=budget)
    t = Trainer(model, data, config, seed=a.seed)
    points = sorted({round(budget * x) for x in (1 / 12, 1 / 2, 1)} | {short})
    t1 = time.time()
    while t.step < budget:
        t.train_step()
        if t.step in points:
            curve.append((t.step, evaluate()))
            log(f"{method}: step {t.step} val_bpc {curve[-1][1]:.4f} "
                f"({(time.time() - t1) / t.step:.2f} s/step)")
    # the fine-tuned model with its FAVOR++/# fits (Trainer.state keeps them; generate.py reads it)
    t.save(os.path.join(a.out, f"finetune-{method}.pt"))
    at = dict(curve)
    return dict(method=method, kind="finetune", baseline_steps=steps0, steps_5=short,
                steps_20=budget, bpc_converted=at[0], bpc_5=at[short], bpc_20=at[budget],
                curve=curve, fit=info, fit_seconds=fit_seconds,
                step_seconds=(time.time() - t1) / budget, lr=a.lr, seed=a.seed,
                eval_windows=a.eval_windows, threads=torch.get_num_threads())


def scratch(a, method, data):
    _, ck = load_model(a.baseline)
    path = os.path.join(a.out, f"scratch-{method}.pt")
    if os.path.exists(path):
        t = Trainer.resume(path, data)
        log(f"{method}: resumed {path} at step {t.step}")
        curve = t.extra["curve"]
    else:
        torch.manual_seed(ck["seed"])
        model = CharTransformer(**dict(ck["config"], attention=attention_preset(method)))
        train = dict(ck["train"], eval_windows=a.eval_windows)
        if a.scratch_steps:
            train.update(steps=a.scratch_steps, eval_every=max(1, a.scratch_steps // 12))
        if a.quick:
            train.update(steps=min(train["steps"], QUICK_STEPS), batch=QUICK["batch"],
                         eval_every=1)
        config = TrainConfig(**train)
        t = Trainer(model, data, config, seed=ck["seed"], extra=dict(curve=[]))
        curve = t.extra["curve"]
    c = t.config
    t1, first = time.time(), t.step
    while t.step < c.steps:
        t.train_step()
        if t.step % c.eval_every == 0 or t.step == c.steps:
            curve.append((t.step, bits_per_char(t.model, data, "val", count=a.eval_windows)))
            log(f"{method}: step {t.step} val_bpc {curve[-1][1]:.4f} "
                f"({(time.time() - t1) / (t.step - first):.2f} s/step)")
            t.save(path)
    return dict(method=method, kind="scratch", steps=c.steps, bpc=curve[-1][1], curve=curve,
                seed=t.seed, eval_windows=a.eval_windows, threads=torch.get_num_threads(),
                step_seconds=(time.time() - t1) / max(1, c.steps - first))


def run_task(a, task):
    kind, method = task.split(":", 1)
    data = load_data(a)
    t0 = time.time()
    result = (fine_tune if kind == "finetune" else scratch)(a, method, data)
    result["seconds"] = time.time() - t0
    path = os.path.join(a.out, f"{kind}-{method}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(path + ".tmp", path)
    log(f"{task}: done in {result['seconds'] / 60:.1f} min -> {path}")


def run_all(a, tasks):
    """Runs the tasks without a result, --jobs processes at a time."""
    todo = [t for t in tasks
            if not os.path.exists(os.path.join(a.out, t.replace(":", "-", 1) + ".json"))]
    threads = max(1, 2 // a.jobs) if a.threads is None else a.threads
    running, failed = [], []
    started = time.time()
    log(f"study: {len(todo)} of {len(tasks)} tasks to run, {a.jobs} at a time, "
        f"{threads} thread(s) each; logs in {a.out}/")
    while todo or running:
        while todo and len(running) < a.jobs:
            task = todo.pop(0)
            logf = open(os.path.join(a.out, task.replace(":", "-", 1) + ".log"), "w")
            cmd = [sys.executable, os.path.abspath(__file__), "--task", task, "--out", a.out,
                   "--baseline", a.baseline, "--threads", str(threads), "--lr", str(a.lr),
                   "--fine-tune", str(a.fine_tune), "--eval-windows", str(a.eval_windows),
                   "--seed", str(a.seed), "--data", a.data]
            if a.scratch_steps:
                cmd += ["--scratch-steps", str(a.scratch_steps)]
            if a.quick:
                cmd.append("--quick")
            running.append((task, subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT),
                            logf, time.time()))
            log(f"  started {task}")
        time.sleep(0.2 if a.quick else 2)  # a task takes minutes, a quick one seconds
        for item in list(running):
            task, proc, logf, t0 = item
            if proc.poll() is not None:
                logf.close()
                running.remove(item)
                status = "done" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
                if proc.returncode != 0:
                    failed.append(task)
                log(f"  {task} {status} in {(time.time() - t0) / 60:.1f} min "
                    f"(study {(time.time() - started) / 60:.1f} min)")
    return failed


def load_results(out):
    res = {}
    for name in sorted(os.listdir(out)):
        if name.endswith(".json"):
            with open(os.path.join(out, name)) as f:
                r = json.load(f)
            res[(r["kind"], r["method"])] = r
    return res


def table(a):
    """OUT/table.md and the plots from the JSON results."""
    model, ck = load_model(a.baseline)
    setup(2)
    base = bits_per_char(model, load_data(a), "val", count=a.eval_windows)
    res = load_results(a.out)
    order = lambda kind, names: [res[key] for key in sorted(
        (k for k in res if k[0] == kind),
        key=lambda k: (names.index(k[1]) if k[1] in names else len(names), k[1]))]
    fts = order("finetune", METHODS)
    control = res.get(("finetune", "exact"))
    lines = [f"Baseline (exact attention, {ck['train']['steps']} steps): validation "
             f"**{base:.4f}** bpc ({a.eval_windows} windows).", "",
             "| method | F | after conversion | fine-tune 5% | fine-tune 20% | vs baseline "
             "(20%) |" + (" vs exact fine-tuned (20%) |" if control else "") + " s/step |",
             "|---|---:|---:|---:|---:|---:|" + ("---:|" if control else "") + "---:|"]
    for r in fts:
        fam, size = parse_method(r["method"])
        feats = size * 2 if fam == "hedgehog" else size
        if fam is None:
            spec = attention_preset(r["method"])
            feats = spec.get("features", spec.get("codes", "-"))
        name = "exact (control)" if r["method"] == "exact" else r["method"]
        vs = (f" {100 * (r['bpc_20'] / control['bpc_20'] - 1):+.1f}% |" if control else "")
        lines.append(f"| {name} | {feats} | {r['bpc_converted']:.4f} | {r['bpc_5']:.4f} "
                     f"| {r['bpc_20']:.4f} | {100 * (r['bpc_20'] / base - 1):+.1f}% |{vs} "
                     f"{r['step_seconds']:.2f} |")
    if fts:
        lines += ["", f"Fine-tunes: {fts[0]['steps_5']} and {fts[0]['steps_20']} steps (5% and "
                  f"20% of the baseline's), lr {fts[0]['lr']}; s/step with "
                  f"{fts[0]['threads']} thread(s)."]
    sc = order("scratch", SCRATCH)
    if sc:
        lines += ["", "| from scratch | steps | validation bpc | vs baseline | s/step |",
                  "|---|---:|---:|---:|---:|"]
        for r in sc:
            lines.append(f"| {r['method']} | {r['steps']} | {r['bpc']:.4f} | "
                         f"{100 * (r['bpc'] / base - 1):+.1f}% | {r['step_seconds']:.2f} |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write(text)
    print(text)
    plots(a, fts, sc, base)


def plots(a, fts, sc, base):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    if fts:
        fig, ax = plt.subplots(figsize=(8, 5))
        colors = plt.get_cmap("tab20").colors
        for i, r in enumerate(fts):
            s, b = zip(*r["curve"])
            style = "--" if r["method"] in ("exact",) or "iid" in r["method"] else "-"
            ax.plot(s, b, marker="o", ms=3, ls=style, color=colors[i % len(colors)],
                    label="exact (fine-tuned control)" if r["method"] == "exact" else r["method"])
        ax.axhline(base, color="k", ls=":", lw=1, label="exact baseline")
        finals = [b for r in fts for _, b in r["curve"][1:]] + [base]
        ax.set_ylim(min(finals) - 0.05, max(finals) + 0.1 if max(finals) < 1.5 * base
                    else 1.4 * base)
        ax.set_xlabel("fine-tuning steps after conversion")
        ax.set_ylabel("validation bits per character")
        ax.set_title("Converted from the exact baseline: bpc against fine-tuning steps\n"
                     "(points above the top are clipped: see the table)")
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        fig.savefig(os.path.join(a.out, "finetune.png"), dpi=110)
    if sc:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for r in sc:
            s, b = zip(*r["curve"])
            ax.plot(s, b, marker="o", ms=3, label=f"{r['method']} from scratch")
        ax.axhline(base, color="k", ls="--", lw=1, label="exact baseline (final)")
        ax.set_xlabel("training steps")
        ax.set_ylabel("validation bits per character")
        ax.set_ylim(top=4)
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(a.out, "scratch.png"), dpi=110)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="runs/study")
    p.add_argument("--baseline", default=BASELINE)
    p.add_argument("--only", help="comma-separated methods (default: all of METHODS)")
    p.add_argument("--no-scratch", action="store_true")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--lr", type=float, default=1e-3, help="fine-tuning peak learning rate")
    p.add_argument("--fine-tune", type=float, default=0.2,
                   help="fine-tuning budget as a fraction of the baseline's steps")
    p.add_argument("--eval-windows", type=int, default=256)
    p.add_argument("--scratch-steps", type=int, default=None,
                   help="default: the baseline's steps (its budget)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default=DATA)
    p.add_argument("--task", help=argparse.SUPPRESS)
    p.add_argument("--table-only", action="store_true")
    p.add_argument("--quick", action="store_true", help="a smoke test (the module docstring)")
    a = p.parse_args(argv)
    if a.quick:
        a.eval_windows = min(a.eval_windows, QUICK["windows"])
        a.only = a.only or ",".join(QUICK_METHODS)
    os.makedirs(a.out, exist_ok=True)
    if a.task:
        setup(a.threads or 1)
        run_task(a, a.task)
        return
    if not a.table_only:
        methods = a.only.split(",") if a.only else METHODS
        for m in methods:
            parse_method(m)
        tasks = [] if a.no_scratch else [f"scratch:{m}" for m in SCRATCH if m in methods]
        tasks += [f"finetune:{m}" for m in methods]
        log(f"seed {a.seed}; baseline {a.baseline}; fine-tune lr {a.lr}, "
            f"{a.fine_tune:.0%} of the baseline's steps")
        failed = run_all(a, tasks)
        if failed:
            log(f"failed: {', '.join(failed)} (see their logs)")
    table(a)


if __name__ == "__main__":
    main()
