"""Generation speed against position: the time of every streamed token from a short prompt
to position --length (default 16384), for favor's streaming decoder (a fixed-size state per
layer) and for exact attention with a key-value cache (preallocated, doubled when full), in
one run on the same model weights.

    python examples/shakespeare/decode_speed.py --out runs/decode.json --plot runs/decode.png
    python examples/shakespeare/decode_speed.py --quick      # to position 64, bins of 16

The model is the shipped baseline (sinusoidal positions: every position is reachable) as
trained (exact) and converted (--methods: presets of favor.models.training, calibration as
the conversion study's); tokens are drawn greedily, so both runs decode real text-like
input. Per-token times are medians over bins of --bin positions; the table gives them at a
few positions, the state or cache size there, and the ratio exact / method at the last bin.
"""
import argparse
import json
import os
import time

import torch

from common import DATA, HERE, add_quick, calibration, setup
from favor.models import CharData
from favor.models.conversion import convert_method
from favor.models.training import load_model

BASELINE = os.path.join(HERE, "checkpoints", "exact.pt")
QUICK_LENGTH, QUICK_BIN = 64, 16


def state_bytes(model, state):
    if model.method == "exact":
        return sum(4 * 2 * s[2] * s[0].shape[1] * s[0].shape[3] for s in state)
    return sum(int(s.state_bytes) for s in state)


@torch.no_grad()
def time_decode(model, prompt, length, bin_size):
    """Per-token seconds of streaming tokens at positions len(prompt) .. length - 1."""
    model.eval()
    state = model._start(1)
    logits = model._step(prompt[None], state, 0)[:, -1]
    times, sizes = [], {}
    for pos in range(prompt.shape[0], length):
        nxt = logits.argmax(-1, keepdim=True)
        t0 = time.perf_counter()
        logits = model._step(nxt, state, pos)[:, -1]
        times.append(time.perf_counter() - t0)
        if (pos + 1) % bin_size == 0:
            sizes[pos + 1] = state_bytes(model, state)
    return times, sizes


def median(xs):
    s = sorted(xs)
    return s[len(s) // 2]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", default=BASELINE)
    p.add_argument("--methods", default="favor-orth-256,vq-64",
                   help="comma-separated methods timed against exact (study names)")
    p.add_argument("--length", type=int, default=16384)
    p.add_argument("--bin", type=int, default=256)
    p.add_argument("--prompt", default="ROMEO:")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default 2; --quick: 1)")
    p.add_argument("--out", help="JSON with every per-token time")
    p.add_argument("--plot", help="PNG: per-token time against position")
    p.add_argument("--data", default=DATA)
    add_quick(p, f"to position {QUICK_LENGTH} at most, bins of {QUICK_BIN}, 4 calibration "
              "windows")
    a = p.parse_args(argv)
    setup(a.threads, a.quick)
    if a.quick:
        a.length, a.bin = min(a.length, QUICK_LENGTH), min(a.bin, QUICK_BIN)
    base, ck = load_model(a.checkpoint)
    data = CharData.from_file(a.data, chars=ck.get("chars"))
    calib = calibration(data, base.context, 0, a.quick)
    prompt = data.encode(a.prompt)
    models = {"exact": base}
    for m in a.methods.split(","):
        models[m] = convert_method(base, m, calib)[0]
    print(f"torch threads {torch.get_num_threads()}; positions {prompt.shape[0]}..{a.length}; "
          f"medians over bins of {a.bin}", flush=True)
    res = {}
    for name, model in models.items():
        t0 = time.time()
        times, sizes = time_decode(model, prompt, a.length, a.bin)
        bins = [(prompt.shape[0] + i + len(times[i:i + a.bin]), median(times[i:i + a.bin]))
                for i in range(0, len(times), a.bin)]
        res[name] = dict(times=times, bins=bins, sizes=sizes, seconds=time.time() - t0)
        print(f"{name}: {len(times)} tokens in {res[name]['seconds']:.1f} s", flush=True)
    show = [p_ for p_ in (256, 1024, 2048, 4096, 8192, 16384) if p_ <= a.length] or [a.length]
    names = list(res)
    print("\n| position | " + " | ".join(f"{n} ms/token" for n in names) + " | "
          + " | ".join(f"{n} state" for n in names) + " |")
    print("|---:" * (1 + 2 * len(names)) + "|")
    for pos in show:
        cells = []
        for n in names:
            near = min(res[n]["bins"], key=lambda b: abs(b[0] - pos))
            cells.append(f"{1e3 * near[1]:.3f}")
        sizes = [res[n]["sizes"].get(pos) for n in names]
        cells += [f"{s / 2**20:.2f} MiB" if s else "-" for s in sizes]
        print(f"| {pos} | " + " | ".join(cells) + " |")
    last = {n: res[n]["bins"][-1][1] for n in names}
    first = {n: res[n]["bins"][0][1] for n in names}
    for n in names[1:]:
        print(f"exact / {n} at position {res[n]['bins'][-1][0]}: "
              f"{last['exact'] / last[n]:.2f}x; {n} last bin / first bin "
              f"{last[n] / first[n]:.2f}, exact {last['exact'] / first['exact']:.2f}")
    for path in (a.out, a.plot):
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(length=a.length, bin=a.bin, threads=torch.get_num_threads(),
                           results=res), f)
    if a.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for n in names:
            x, y = zip(*res[n]["bins"])
            ax.plot(x, [1e3 * v for v in y], label=n if n != "exact" else "exact (KV cache)")
        ax.set_xlabel("position (characters)")
        ax.set_ylabel("ms per token (median per bin)")
        ax.set_ylim(bottom=0)
        ax.set_title("Streamed generation: time per token against position")
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.plot, dpi=110)


if __name__ == "__main__":
    main()
