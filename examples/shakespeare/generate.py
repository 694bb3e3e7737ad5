"""Generate text from a checkpoint, streamed token by token (favor's decoders; a key-value
cache for exact attention).

    PYTHONPATH=build/python .venv/bin/python examples/shakespeare/generate.py runs/exact.pt \
        --prompt "ROMEO:" -n 500 --temperature 0.8 --seed 0
"""
import argparse
import sys
import time

import torch

from common import DATA, setup
from favor.models import CharData
from favor.models.conversion import calibration_windows
from favor.models.training import load_model


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--prompt", default="\n")
    p.add_argument("-n", type=int, default=500, help="characters to generate")
    p.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--attention", help="convert first: a method (train.py --init --attention)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--data", default=DATA, help="the calibration text of --attention")
    a = p.parse_args(argv)
    setup(a.threads)
    ck = torch.load(a.checkpoint, map_location="cpu", weights_only=False)
    chars = ck.get("chars")
    calib = None
    if a.attention:
        data = CharData.from_file(a.data, chars=chars)
        calib = calibration_windows(data, ck["config"]["context"], a.seed)
    model, _ = load_model(a.checkpoint, attention=a.attention, calibration=calib, seed=a.seed)
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
