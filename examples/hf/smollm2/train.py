"""Converts SmolLM2-135M (smollm2.py) and trains the conversion: attention transfer
(favor.hf.transfer, stage 1) then end-to-end distillation against the original
(favor.hf.distill, stage 2: KL to its next-token distributions, LoRA r on q, k, v, o and
favor's maps), on the varied calibration corpus (examples/hf/corpus.py; --data stdlib: the
standard library's docstrings alone, as the first study); saves the compact form
(favor.hf.save_pretrained: favor's tensors and the LoRA deltas) in OUT/adapter, the model
after transfer alone in OUT/transferred, and OUT/train.json (settings, losses, rates,
held-out KL). Resumable: rerun the same command and each stage resumes from its checkpoint
in OUT.

    python examples/hf/smollm2/train.py --out runs/pf --method positive-fit --features 128 \
        --window 64 --sinks 4 --distill-tokens 1000000 --teacher-cache runs/teacher-k64
    python examples/hf/smollm2/train.py --out runs/win --method window --window 64 --sinks 4 \
        --distill-tokens 1000000 --teacher-cache runs/teacher-k64

--teacher-cache FOLDER distils from the teacher's top-k distributions kept there (made on
the way where missing, then shared by every row and resumed run); without it the teacher
runs live. --precision auto runs bf16 where the machine has it. --minutes M bounds this
run's time: the distillation stops checkpointed (rerun to go on); without --distill-steps
or --distill-tokens the step count is planned from a measured step (OUT/plan.json) to fill
the minutes. --device cuda (or auto) runs on a GPU (scripts/gpu-distill.sh).
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


def arguments(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--method", default="positive-fit")
    ap.add_argument("--features", type=int, default=128)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--sinks", type=int, default=4)
    ap.add_argument("--gate", type=float, help="a gated hybrid starting at this gate (1e-3)")
    ap.add_argument("--gate-lr", type=float, default=0.1)
    ap.add_argument("--softmax-layers", default="",
                    help="layers kept on softmax, e.g. 7,18,20 (favor.hf.rank_layers)")
    ap.add_argument("--length", type=int, default=1024, help="tokens per training sequence")
    ap.add_argument("--transfer-steps", type=int, default=200)
    ap.add_argument("--transfer-batches", type=int, default=8)
    ap.add_argument("--distill-steps", type=int)
    ap.add_argument("--distill-tokens", type=int, help="steps = tokens // length")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--lora-r", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--layers", type=int, help="the first LAYERS layers only (a quick check)")
    ap.add_argument("--data", choices=["corpus", "stdlib"], default="corpus")
    ap.add_argument("--corpus", default="runs/corpus", help="the corpus folder (corpus.py)")
    ap.add_argument("--calibration-windows", type=int, help="use only this many windows")
    ap.add_argument("--teacher-cache", metavar="FOLDER")
    ap.add_argument("--k", type=int, default=64, help="tokens a cache keeps per position")
    ap.add_argument("--precision", choices=["auto", "bf16", "float32"], default="auto")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    ap.add_argument("--compile", choices=["auto", "on", "off"], default="auto",
                    help="torch.compile the student's layers (auto: for runs of >= 200 "
                    "steps, where the ~2 min of compiling pays)")
    ap.add_argument("--minutes", type=float, help="this run's time budget")
    ap.add_argument("--eval-windows", type=int, default=8,
                    help="held-out windows per domain for the KL at the end (0: none)")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 2 layers, 256-token windows, a few steps (~30 s)")
    args = ap.parse_args(argv)
    if args.quick:
        args.layers, args.length = 2, 256
        args.calibration_windows = args.calibration_windows or 6
        args.transfer_steps, args.transfer_batches = 5, 1
        if args.distill_steps is None and args.distill_tokens is None and args.minutes is None:
            args.distill_steps = 2
        args.eval_windows = min(args.eval_windows, 1)
    return args


def data(args, tok):
    """(calibration windows [n, length], {domain: held-out ids}): the corpus (every source's
    held-out part and the out-of-domain one) or the stdlib docstrings."""
    if args.data == "stdlib":
        cal, held = smollm2.token_text(tok)
        n = cal.numel() // args.length
        return smollm2.windows(cal, args.length, n), {"python-stdlib": held}
    import corpus
    c = corpus.build(tok, args.corpus)
    held = {name: c.held_out(name) for name in c.meta["sources"]}
    return c.calibration(args.length, seed=args.seed), held


def held_out_kl(student, teacher, held, length, count):
    """{domain: mean KL(teacher || student) per token} over `count` windows of each domain."""
    import favor.hf as fh
    from favor.hf.distill import kl_loss
    out = {}
    device = next(student.parameters()).device
    with torch.no_grad(), fh.merged(student):
        for name, ids in held.items():
            n = min(count, ids.numel() // length)
            if n:
                rows = smollm2.windows(ids, length, n).to(device).split(1)
                out[name] = sum(float(kl_loss(student, teacher, r)) for r in rows) / n
    return out


def plan_steps(args, student, teacher, batches, seconds):
    """Steps that fill `seconds` at the rate of two measured steps (OUT/plan.json keeps it,
    so a resumed run keeps the same schedule)."""
    path = os.path.join(args.out, "plan.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)["steps"]
    import favor.hf as fh
    probe = copy.deepcopy(student)
    run = dict(lr=args.lr, progress=False, lora={"r": args.lora_r}, precision=args.precision)
    fh.distill(probe, teacher, batches[:1], steps=1, **run)  # warm-up: kernels, caches
    t = time.perf_counter()
    fh.distill(probe, teacher, batches[1:3] or batches[:1], steps=2, **run)
    per_step = (time.perf_counter() - t) / 2
    del probe
    steps = max(1, int(0.9 * seconds / per_step))  # a tenth kept for saving and evaluating
    with open(path, "w") as f:
        json.dump({"steps": steps, "seconds_per_step": per_step, "budget_seconds": seconds}, f)
    print(f"plan: {per_step:.2f} s a step -> {steps} steps in {seconds / 60:.1f} min", flush=True)
    return steps


def main(argv=None):
    args = arguments(argv)
    began = time.perf_counter()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available()
                          else ("cpu" if args.device == "auto" else args.device))
    print(f"seed {args.seed}, torch threads {torch.get_num_threads()}, device {device}",
          flush=True)
    import favor.hf as fh
    os.makedirs(args.out, exist_ok=True)
    teacher, tok = smollm2.load(args.layers)
    teacher.to(device)
    student = copy.deepcopy(teacher)
    windows, held = data(args, tok)
    if args.calibration_windows:
        windows = windows[:args.calibration_windows]
    batches = list(windows.to(device).split(1))
    options = {"window": args.window, "sinks": args.sinks}
    if args.method != "window":
        options.update(features=args.features, seed=args.seed)
    if args.gate is not None:
        options["gate"] = args.gate
    if args.softmax_layers:
        options["softmax_layers"] = [int(x) for x in args.softmax_layers.split(",")]
    print(fh.convert(student, args.method, **options).method, options, flush=True)
    log = {"method": args.method, "layers": args.layers, "options": options,
           "length": args.length, "seed": args.seed, "threads": torch.get_num_threads(),
           "device": str(device), "data": args.data,
           "calibration_tokens": int(windows.numel())}
    learns = any(True for _, _, core in fh.cores(student) for _ in core.parameters())
    if learns:  # stage 1 (the window and sinks alone have nothing to fit)
        t = time.perf_counter()
        report = fh.transfer(student, batches[:args.transfer_batches],
                             steps=args.transfer_steps,
                             checkpoint=os.path.join(args.out, "transfer"))
        log["transfer"] = {"minutes": (time.perf_counter() - t) / 60,
                           "tokens": args.transfer_batches * args.length,
                           "steps_per_layer": args.transfer_steps,
                           "error_before": [r["error_before"] for r in report],
                           "error_after": [r["error_after"] for r in report]}
        print(report, flush=True)
        fh.save_pretrained(student, os.path.join(args.out, "transferred"), compact=True)
    # the training sequences after the transfer's, cycled
    rest = batches[args.transfer_batches:] + batches[:args.transfer_batches]
    source = teacher
    if args.teacher_cache:
        from favor.hf.precision import resolve
        source = fh.TeacherCache(args.teacher_cache, teacher, k=args.k,
                                 precision=resolve(args.precision, device))
    budget = None if args.minutes is None else args.minutes * 60 - (time.perf_counter() - began)
    if args.distill_steps is not None:
        steps = args.distill_steps
    elif args.distill_tokens is not None:
        steps = max(1, args.distill_tokens // args.length)
    elif budget is not None:
        steps = plan_steps(args, student, source, rest, budget)
    else:
        steps = 240
    compiled = args.compile == "on" or (args.compile == "auto" and steps >= 200)
    distilled = fh.distill(student, source, rest, steps=steps, lr=args.lr, compile=compiled,
                           lora={"r": args.lora_r}, seed=args.seed, precision=args.precision,
                           checkpoint=os.path.join(args.out, "distill"), gate_lr=args.gate_lr,
                           max_seconds=None if budget is None else max(1.0, budget * 0.95))
    print(distilled, flush=True)
    log["distill"] = {"steps": steps, "done": distilled.done,
                      "tokens": distilled.done * args.length, "lr": args.lr,
                      "lora_r": args.lora_r, "precision": distilled.precision,
                      "compile": compiled,
                      "teacher": distilled.teacher, "minutes_this_run": distilled.seconds / 60,
                      "tokens_per_second_this_run":
                          distilled.tokens / distilled.seconds if distilled.seconds else None,
                      "resumed_at": distilled.resumed_at, "losses": list(distilled)}
    if args.gate is not None:
        log["gates"] = fh.gates(student)
    if args.eval_windows:
        log["held_out_kl"] = held_out_kl(student, teacher, held, args.length, args.eval_windows)
        print("held-out KL:", {k: round(v, 4) for k, v in log["held_out_kl"].items()},
              flush=True)
    fh.save_pretrained(student, os.path.join(args.out, "adapter"))
    path = os.path.join(args.out, "train.json")
    if os.path.exists(path):  # a resumed run keeps the record of the earlier ones
        with open(path) as f:
            log["earlier"] = json.load(f)
    with open(path, "w") as f:
        json.dump(log, f, indent=1)
    state = "done" if distilled.done == steps else f"stopped at {distilled.done}/{steps}: rerun"
    print(f"saved {args.out}/adapter ({state})", flush=True)


if __name__ == "__main__":
    main()
