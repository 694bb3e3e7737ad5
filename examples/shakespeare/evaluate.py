"""Validation bits per character of a checkpoint, optionally converted to another attention.

    python examples/shakespeare/evaluate.py runs/exact.pt
    ... runs/exact.pt --attention favor-orth-256          # right after conversion
    ... runs/exact.pt --quick                             # 4 windows, small fits: seconds
"""
import argparse
import time

from common import DATA, QUICK, add_quick, calibration, fit_options, setup
from favor.models import CharData, bits_per_char
from favor.models.conversion import convert_method
from favor.models.training import load_model


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--attention", help="convert first: a method (train.py --init --attention), "
                   "fitted to 16 training windows where it needs it")
    p.add_argument("--windows", type=int, default=256, help="fixed validation windows")
    p.add_argument("--split", default="val", choices=["train", "val"])
    p.add_argument("--seed", type=int, default=0, help="seed of the calibration windows and fits")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default 2; --quick: 1)")
    p.add_argument("--data", default=DATA)
    add_quick(p, f"at most {QUICK['windows']} windows, {QUICK['calibration']} calibration "
              f"windows and {QUICK['fit_steps']} steps per learned-map fit")
    a = p.parse_args(argv)
    setup(a.threads, a.quick)
    if a.quick:
        a.windows = min(a.windows, QUICK["windows"])
    model, ck = load_model(a.checkpoint)
    data = CharData.from_file(a.data, chars=ck.get("chars"))
    context = model.context
    if a.attention:
        calib = calibration(data, context, a.seed, a.quick)
        model, _ = convert_method(model, a.attention, calib, seed=a.seed, **fit_options(a.quick))
        model.eval()
    t0 = time.time()
    bpc = bits_per_char(model, data, a.split, count=a.windows)
    print(f"{a.checkpoint} attention {model.spec} {a.split}_bpc {bpc:.4f} "
          f"({a.windows} windows of {context}; {time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
