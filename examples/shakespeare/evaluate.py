"""Validation bits per character of a checkpoint, optionally converted to another attention.

    PYTHONPATH=build/python .venv/bin/python examples/shakespeare/evaluate.py runs/exact.pt
    ... runs/exact.pt --attention favor-orth-256          # right after conversion
"""
import argparse
import time

import torch

from common import DATA, setup
from favor.models import CharData, bits_per_char
from favor.models.conversion import calibration_windows
from favor.models.training import load_model


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--attention", help="convert first: a method (train.py --init --attention), "
                   "fitted to 16 training windows where it needs it")
    p.add_argument("--windows", type=int, default=256, help="fixed validation windows")
    p.add_argument("--split", default="val", choices=["train", "val"])
    p.add_argument("--seed", type=int, default=0, help="seed of the calibration windows and fits")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--data", default=DATA)
    a = p.parse_args(argv)
    setup(a.threads)
    ck = torch.load(a.checkpoint, map_location="cpu", weights_only=False)
    data = CharData.from_file(a.data, chars=ck.get("chars"))
    context = ck["config"]["context"]
    calib = calibration_windows(data, context, a.seed)
    model, _ = load_model(a.checkpoint, attention=a.attention, calibration=calib, seed=a.seed)
    t0 = time.time()
    bpc = bits_per_char(model, data, a.split, count=a.windows)
    print(f"{a.checkpoint} attention {model.spec} {a.split}_bpc {bpc:.4f} "
          f"({a.windows} windows of {context}; {time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
