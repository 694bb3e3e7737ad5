"""Generate text from a checkpoint, streamed token by token (favor's decoders; a key-value
cache for exact attention).

    PYTHONPATH=build/python /usr/bin/python3 examples/shakespeare/generate.py runs/exact.pt \
        --prompt "ROMEO:" -n 500 --temperature 0.8 --seed 0
"""
import argparse
import sys
import time

import torch

from common import DATA, setup
from favor.models import CharData
from favor.models.training import attention_preset, load_model


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--prompt", default="\n")
    p.add_argument("-n", type=int, default=500, help="characters to generate")
    p.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--attention", help="convert first: a preset or JSON spec (train.py)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--data", default=DATA, help="only for VQ calibration after --attention")
    a = p.parse_args(argv)
    setup(a.threads)
    ck = torch.load(a.checkpoint, map_location="cpu")
    chars = ck.get("chars")
    spec = attention_preset(a.attention) if a.attention else None
    calib = None
    if spec is not None and spec["method"] == "vq":
        data = CharData.from_file(a.data, chars=chars)
        calib, _ = data.batch("train", 32, ck["config"]["context"],
                              torch.Generator().manual_seed(a.seed + 2))
    model, _ = load_model(a.checkpoint, attention=spec, calibration=calib)
    vocab = CharData(chars, chars=chars) if chars else None
    prompt = vocab.encode(a.prompt)
    t0 = time.time()
    ids = model.generate(prompt, a.n, temperature=a.temperature, top_k=a.top_k, seed=a.seed)
    dt = time.time() - t0
    print(vocab.decode(ids))
    sys.stderr.write(f"{a.n} characters in {dt:.2f} s: {a.n / dt:.0f} tokens/s "
                     f"(attention {model.spec})\n")


if __name__ == "__main__":
    main()
