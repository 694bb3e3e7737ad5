"""Distillation tokens per second on this machine, before and after issue 47's changes, each
change's share, in one run (ratios against the first row, measured minutes apart on the same
batches): SmolLM2-135M (smollm2.py) converted (default: the shipped positive-fit hybrid,
128 features, w = 64, s = 4; --method window: the window and sinks alone), one 1024-token
sequence a step, LoRA r = 8, the machine's threads.

Rows, each adding one change to the row above:
- before: the step as it was (ef42b2e): the live float32 teacher, the student's logits made
  per chunk of 256 inside a checkpoint (head products: 4 per chunk), autograd's KL;
- fused head and KL (favor.hf.kl.linear_kl: 2 head products per chunk, no recompute);
- teacher cache (favor.hf.TeacherCache, k = 64: no teacher in the step);
- bf16 (favor.hf.precision; only where favor.bf16_available(): AVX512-BF16 / AMX);
- torch.compile of the student's decoder layers and the loss's elementwise part
  (distill(compile=True); the first step's compiling is printed beside it).
Also: the teacher cache's own fill rate (tokens/s, float32 and bf16), paid once per
calibration set.

    python examples/hf/smollm2/bench_distill.py --out examples/hf/smollm2/results
    scripts/as-cpu.sh avx2 .venv/bin/python examples/hf/smollm2/bench_distill.py --tag avx2

Writes OUT/bench_distill[-TAG].json and prints a markdown table with `lscpu`'s model name
and flags. Seeds: conversion 0, LoRA 0, window dropout 0.

--saved-states STEPS: does FavorCore.save_causal_states pay in this step? STEPS steps each
way, interleaved (off, on, off, ...; two warm-up steps), on the uncompiled fast path (bf16
from the cache where bf16 runs): the medians and their ratio. The attention op alone gains
(the backward one sweep from the forward's chunk states), the step holds every layer's
states until its backward (docs/performance.md, "Saved causal states in training").

--quality STEPS: the same result? Distils STEPS steps (lr 3e-4, the study's batches) from
the same converted model three ways: float32 from the live teacher (the whole
distribution: the step before), float32 from a float32 teacher cache (k = 64), and the
machine's fast path (bf16 from a bf16 cache, where bf16 runs); then the held-out KL to the
float32 teacher of each (8 windows of 1024 of the held-out docstrings, float32), with each
row's ratio to the first (the goal: within 2%).
"""
import argparse
import copy
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import smollm2  # noqa: E402


def lscpu():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return platform.processor()
    info = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    flags = set(info.get("Flags", "").split())
    have = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{info.get('Model name', '?').strip()}, {info.get('CPU(s)', '?').strip()} CPUs, " \
           f"{' '.join(have)}"


def old_loss(student, teacher, inputs, chunk=256):
    """The step's loss as of ef42b2e (favor.hf.distill.kl_loss then): the baseline."""
    from torch.utils.checkpoint import checkpoint

    def chunk_kl(h, t_logp, w, head):
        logp = torch.log_softmax(head(h), -1)
        return ((t_logp.exp() * (t_logp - logp)).sum(-1) * w).sum()

    with torch.no_grad():
        t_hidden = teacher.base_model(**inputs, use_cache=False).last_hidden_state
    hidden = student.base_model(**inputs, use_cache=False).last_hidden_state
    weight = torch.ones(hidden.shape[:2])
    head, t_head = student.get_output_embeddings(), teacher.get_output_embeddings()
    total = hidden.new_zeros(())
    for a in range(0, hidden.shape[1], chunk):
        with torch.no_grad():
            t_logp = torch.log_softmax(t_head(t_hidden[:, a:a + chunk]), -1)
        total = total + checkpoint(chunk_kl, hidden[:, a:a + chunk], t_logp,
                                   weight[:, a:a + chunk], head, use_reentrant=False)
    return total / weight.sum()


def timed_steps(step, params, count):
    """Median seconds of `count` optimiser steps after one warm-up."""
    opt = torch.optim.AdamW(params, lr=1e-5)
    times = []
    for i in range(count + 1):
        t = time.perf_counter()
        opt.zero_grad()
        step(i).backward()
        opt.step()
        if i:
            times.append(time.perf_counter() - t)
    return statistics.median(times), times


def saved_states_ab(student, params, cache, batches, steps):
    """{off, on: median seconds a step, on_over_off, times}: save_causal_states off and on in
    turn (two warm-up steps), the rest as the step above."""
    import favor.hf as fh
    from favor.hf.distill import kl_loss
    cores = [core for _, _, core in fh.cores(student)]
    opt = torch.optim.AdamW(params, lr=1e-5)
    times = {False: [], True: []}
    for i in range(2 * steps + 2):
        save = bool(i % 2)
        for core in cores:
            core.save_causal_states = save
        t = time.perf_counter()
        opt.zero_grad()
        kl_loss(student, cache, batches[i % len(batches)]).backward()
        opt.step()
        if i >= 2:
            times[save].append(time.perf_counter() - t)
    for core in cores:
        core.save_causal_states = False
    off, on = statistics.median(times[False]), statistics.median(times[True])
    print(f"save_causal_states: off {off:.3f} s/step, on {on:.3f} s/step ({on / off:.3f}x; "
          f"{steps} steps each, interleaved)", flush=True)
    return {"off": off, "on": on, "on_over_off": on / off,
            "times_off": times[False], "times_on": times[True]}


def quality(args, teacher, tok, options, folder, ran):
    """[{row, held_out_kl, vs float32, seconds}] (module docstring)."""
    import favor.hf as fh
    from favor.hf.distill import kl_loss
    cal, held = smollm2.token_text(tok)
    train = [{"input_ids": r} for r in
             smollm2.windows(cal, args.length, args.quality).split(1)]
    evaluation = [{"input_ids": r} for r in
                  smollm2.windows(held, args.length, min(8, held.numel() // args.length)).split(1)]
    ways = [("float32, live teacher", "float32", None),
            ("float32, float32 cache k=64", "float32", "float32")]
    if ran == "bf16":
        ways.append(("bf16, bf16 cache k=64", "bf16", "bf16"))
    out = []
    for name, precision, cached in ways:
        student = copy.deepcopy(teacher)
        fh.convert(student, args.method, **options)
        source = teacher if cached is None else fh.TeacherCache(
            os.path.join(folder, "quality-" + cached), teacher, k=64, precision=cached)
        report = fh.distill(student, source, train, steps=args.quality, lr=3e-4,
                            precision=precision, progress=False)
        with torch.no_grad(), fh.merged(student):
            kl = sum(float(kl_loss(student, teacher, b)) for b in evaluation) / len(evaluation)
        out.append({"row": name, "held_out_kl": kl, "seconds": report.seconds,
                    "vs_first": kl / out[0]["held_out_kl"] if out else 1.0})
        print(f"quality: {name:32s} held-out KL {kl:.4f} ({out[-1]['vs_first']:.4f}x) "
              f"after {args.quality} steps, {report.seconds:.0f} s", flush=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--tag", default="", help="a suffix for the output file (e.g. avx2)")
    ap.add_argument("--method", default="positive-fit")
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=4, help="timed steps per row")
    ap.add_argument("--layers", type=int, help="the first LAYERS layers (a quick check)")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--quality", type=int, metavar="STEPS", help="also the result check")
    ap.add_argument("--saved-states", type=int, metavar="STEPS",
                    help="also the interleaved A/B of save_causal_states")
    ap.add_argument("--quick", action="store_true",
                    help="2 layers, 256 tokens, 2 steps, not compiled (seconds)")
    args = ap.parse_args()
    if args.quick:  # a smoke run: no compiling, no quality check
        args.layers, args.length, args.steps, args.no_compile = 2, 256, 2, True
        args.quality = None
    import favor
    import favor.hf as fh
    from favor.hf.distill import kl_loss, trainable
    from favor.hf.precision import low_precision
    cpu = lscpu()
    if os.environ.get("FAVOR_CPU"):
        cpu += f" (run as {os.environ['FAVOR_CPU']}: scripts/as-cpu.sh)"
    print(f"machine: {cpu}; torch threads {torch.get_num_threads()}; "
          f"favor.bf16_available() {favor.bf16_available()}", flush=True)
    teacher, tok = smollm2.load(args.layers)
    cal, _ = smollm2.token_text(tok)
    count = args.steps + 1
    rows_of = smollm2.windows(cal, args.length, count).split(1)
    batches = [{"input_ids": r} for r in rows_of]
    student = copy.deepcopy(teacher)
    options = {"window": 64, "sinks": 4}
    if args.method != "window":
        options.update(features=128, seed=0)
    fh.convert(student, args.method, **options)
    fh.add_adapters(student, r=8)
    params = [p for _, p in trainable(student, "lora")]
    student.train()
    results, tokens = [], args.length
    # The teacher caches live for this run only (removed on exit, also after an error).
    scratch = tempfile.TemporaryDirectory(prefix="favor-bench-cache-")
    folder = scratch.name

    def row(name, step, note=""):
        med, times = timed_steps(step, params, args.steps)
        results.append({"row": name, "seconds_per_step": med, "tokens_per_second": tokens / med,
                        "times": times, "note": note})
        base = results[0]["tokens_per_second"]
        print(f"{name:40s} {med:7.2f} s/step {tokens / med:8.1f} tokens/s "
              f"{tokens / med / base:5.2f}x", flush=True)

    row("before (ef42b2e step)", lambda i: old_loss(student, teacher, batches[i]))
    row("fused head and KL", lambda i: kl_loss(student, teacher, batches[i]))
    caches = {}
    for precision in ("float32", "bf16"):
        if precision == "bf16" and not favor.bf16_available():
            continue
        cache = fh.TeacherCache(os.path.join(folder, precision), teacher, k=64,
                                precision=precision)
        t = time.perf_counter()
        cache.fill(batches, progress=False)
        rate = tokens * len(batches) / (time.perf_counter() - t)
        results.append({"row": f"teacher cache fill ({precision})", "tokens_per_second": rate})
        print(f"{'teacher cache fill (' + precision + ')':40s} {rate:8.1f} tokens/s "
              "(once per calibration set)", flush=True)
        caches[precision] = cache
    row("+ teacher cache (k=64)", lambda i: kl_loss(student, caches["float32"], batches[i]))
    ran = "float32"
    if favor.bf16_available():
        ran = "bf16"
        with low_precision(True, student):
            row("+ bf16", lambda i: kl_loss(student, caches["bf16"], batches[i]))
    else:
        print("bf16: not here (favor.bf16_available() is False): float32 rows only", flush=True)
    saved_states = None
    if args.saved_states:
        with low_precision(ran == "bf16", student):
            saved_states = saved_states_ab(student, params, caches[ran], batches,
                                           args.saved_states)
    if not args.no_compile:  # as distill(compile=True) does it
        from favor.hf.distill import _compiled
        t = time.perf_counter()
        with _compiled(student, fh.cores(student), True), low_precision(ran == "bf16", student):
            kl_loss(student, caches[ran], batches[0]).backward()
            first = time.perf_counter() - t
            row("+ torch.compile (layers, loss)",
                lambda i: kl_loss(student, caches[ran], batches[i]),
                note=f"first step with compiling: {first:.0f} s")
    report = {"machine": cpu, "threads": torch.get_num_threads(), "method": args.method,
              "length": args.length, "layers": args.layers or 30, "rows": results}
    if saved_states:
        report["saved_states"] = saved_states
    if args.quality:
        report["quality"] = quality(args, teacher, tok, options, folder, ran)
    scratch.cleanup()
    os.makedirs(args.out, exist_ok=True)
    name = "bench_distill" + (f"-{args.tag}" if args.tag else "") + ".json"
    with open(os.path.join(args.out, name), "w") as f:
        json.dump(report, f, indent=1)
    print(f"\n{cpu}, {torch.get_num_threads()} threads, {args.method}, {args.length} tokens a "
          "step\n\n| step | s/step | tokens/s | vs before |\n|---|---|---|---|")
    base = results[0]["tokens_per_second"]
    for r in results:
        if "seconds_per_step" in r:
            print(f"| {r['row']} | {r['seconds_per_step']:.2f} | {r['tokens_per_second']:.0f} "
                  f"| {r['tokens_per_second'] / base:.2f}x |")
    for r in results:
        if "seconds_per_step" not in r:
            print(f"| {r['row']} | | {r['tokens_per_second']:.0f} | (once) |")
    if args.quality:
        print(f"\n| distilled {args.quality} steps | held-out KL | vs float32, live teacher |"
              "\n|---|---|---|")
        for r in report["quality"]:
            print(f"| {r['row']} | {r['held_out_kl']:.4f} | {r['vs_first']:.4f}x |")


if __name__ == "__main__":
    main()
