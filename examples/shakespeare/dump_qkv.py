"""Dump the queries, keys and values of every attention layer and head of a checkpoint on
held-out text, as .npy files that `favor accuracy --q --k --v` reads.

    python examples/shakespeare/dump_qkv.py examples/shakespeare/checkpoints/exact.pt \
        --out runs/qkv
    favor accuracy --q runs/qkv/layer0_q.npy --k runs/qkv/layer0_k.npy \
        --v runs/qkv/layer0_v.npy

OUT/layer{L}_{q,k,v}.npy: float32 [windows, heads, length, head_dim], the inputs of layer
L's attention core (after the q/k/v projections; favor's default scale 1/sqrt(head_dim)
applies, as in the model), from `windows` fixed validation windows of `length`
characters (favor.models.CharData.windows: evenly spaced, the same on every run).
OUT/meta.json records the checkpoint, windows, shapes and the text of the first window.
"""
import argparse
import json
import os

import numpy as np
import torch

from common import DATA, add_quick, setup
from favor.models import CharData
from favor.models.conversion import layer_qkv
from favor.models.training import load_model

QUICK_WINDOWS, QUICK_LENGTH = 2, 64


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--out", required=True, help="directory for the .npy files")
    p.add_argument("--windows", type=int, default=8)
    p.add_argument("--length", type=int, default=None, help="default: the model's context")
    p.add_argument("--split", default="val", choices=["train", "val"])
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default 2; --quick: 1)")
    p.add_argument("--data", default=DATA)
    add_quick(p, f"at most {QUICK_WINDOWS} windows of at most {QUICK_LENGTH} characters")
    a = p.parse_args(argv)
    setup(a.threads, a.quick)
    model, ck = load_model(a.checkpoint)
    data = CharData.from_file(a.data, chars=ck.get("chars"))
    length = a.length or model.context
    if a.quick:
        a.windows, length = min(a.windows, QUICK_WINDOWS), min(length, QUICK_LENGTH)
    ids, _ = data.windows(a.split, length, a.windows)
    os.makedirs(a.out, exist_ok=True)
    layers = layer_qkv(model, ids)
    for i, (q, k, v) in enumerate(layers):
        for name, t in (("q", q), ("k", k), ("v", v)):
            path = os.path.join(a.out, f"layer{i}_{name}.npy")
            np.save(path + ".tmp.npy", t.numpy())
            os.replace(path + ".tmp.npy", path)
    meta = dict(checkpoint=a.checkpoint, split=a.split, windows=a.windows, length=length,
                layers=len(layers), shape=list(layers[0][0].shape),
                scale=model.config["d_model"] // model.config["heads"],
                first_window=data.decode(ids[0]))
    meta["scale"] = meta["scale"] ** -0.5
    with open(os.path.join(a.out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"{len(layers)} layers x (q, k, v) {meta['shape']} -> {a.out}/layer*_{{q,k,v}}.npy")


if __name__ == "__main__":
    main()
