"""Converts SmolLM2-135M (smollm2.py) and trains the conversion: attention transfer
(favor.hf.transfer, stage 1) then end-to-end distillation against the original
(favor.hf.distill, stage 2: KL to its next-token distributions, LoRA r on q, k, v, o and
favor's maps), on the standard library's calibration docstrings; saves the compact form
(favor.hf.save_pretrained: favor's tensors and the LoRA deltas) in OUT/adapter, and the
model after transfer alone in OUT/transferred. Resumable:
rerun the same command and each stage resumes from its checkpoint in OUT.

    python examples/hf/smollm2/train.py --out runs/pf --method positive-fit --features 128 \
        --window 64 --sinks 4 --distill-steps 240
    python examples/hf/smollm2/train.py --out runs/win --method window --window 64 --sinks 4
"""
import argparse
import copy
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import smollm2  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--method", default="positive-fit")
    ap.add_argument("--features", type=int, default=128)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--sinks", type=int, default=4)
    ap.add_argument("--length", type=int, default=1024, help="tokens per training sequence")
    ap.add_argument("--transfer-steps", type=int, default=200)
    ap.add_argument("--transfer-batches", type=int, default=8)
    ap.add_argument("--distill-steps", type=int, default=240)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--lora-r", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--layers", type=int, help="the first LAYERS layers only (a quick check)")
    ap.add_argument("--calibration-windows", type=int, help="use only this many windows")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 2 layers, 256-token windows, a few steps (~30 s)")
    args = ap.parse_args()
    if args.quick:
        args.layers, args.length, args.calibration_windows = 2, 256, 4
        args.transfer_steps, args.transfer_batches, args.distill_steps = 5, 1, 2
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"seed {args.seed}, torch threads {torch.get_num_threads()}", flush=True)
    import favor.hf as fh
    teacher, tok = smollm2.load(args.layers)
    student = copy.deepcopy(teacher)
    cal, _ = smollm2.token_text(tok)
    n = min(cal.numel() // args.length, args.calibration_windows or cal.numel())
    batches = list(smollm2.windows(cal, args.length, n).split(1))
    options = {"window": args.window, "sinks": args.sinks}
    if args.method != "window":
        options.update(features=args.features, seed=args.seed)
    print(fh.convert(student, args.method, **options).method, options, flush=True)
    log = {"method": args.method, "layers": args.layers, "options": options, "length": args.length, "seed": args.seed,
           "threads": torch.get_num_threads(), "calibration_tokens": int(cal.numel())}
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
    distilled = fh.distill(student, teacher, rest, steps=args.distill_steps, lr=args.lr,
                           lora={"r": args.lora_r}, seed=args.seed,
                           checkpoint=os.path.join(args.out, "distill"))
    print(distilled, flush=True)
    log["distill"] = {"steps": args.distill_steps, "tokens": args.distill_steps * args.length,
                      "lr": args.lr, "lora_r": args.lora_r, "minutes_this_run":
                      distilled.seconds / 60, "resumed_at": distilled.resumed_at,
                      "losses": list(distilled)}
    fh.save_pretrained(student, os.path.join(args.out, "adapter"))
    path = os.path.join(args.out, "train.json")
    if os.path.exists(path):  # a resumed run keeps the minutes of the first
        with open(path) as f:
            log["earlier"] = json.load(f)
    with open(path, "w") as f:
        json.dump(log, f, indent=1)
    print(f"saved {args.out}/adapter", flush=True)


if __name__ == "__main__":
    main()
