"""Export the weights of a training checkpoint (no optimizer or RNG state): the file a fresh
clone ships and evaluate.py / generate.py load.

    python examples/shakespeare/export.py runs/exact.pt \
        examples/shakespeare/checkpoints/exact.pt [--val-bpc 2.01]
"""
import argparse

import torch

from favor.models.training import save_checkpoint


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkpoint", help="a train.py checkpoint")
    p.add_argument("out", help="the weights-only file to write")
    p.add_argument("--val-bpc", type=float, help="record the measured validation bpc")
    p.add_argument("--quick", action="store_true",
                   help="accepted for the smoke tests of the docs' command lines, which pass it "
                   "to every script of a block; an export has no long work to shorten")
    a = p.parse_args(argv)
    ck = torch.load(a.checkpoint, map_location="cpu", weights_only=False)
    out = dict(config=ck["config"], model=ck["model"], step=ck.get("step"), seed=ck.get("seed"),
               train=ck.get("train"), chars=ck.get("chars"))
    if a.val_bpc is not None:
        out["val_bpc"] = a.val_bpc
    save_checkpoint(a.out, out)
    print(f"wrote {a.out}: step {out['step']}, {sum(v.numel() for v in out['model'].values())} "
          "weights")


if __name__ == "__main__":
    main()
