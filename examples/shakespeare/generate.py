"""Generate text from a checkpoint, streamed token by token (favor's decoders; a key-value
cache for exact attention).

    python examples/shakespeare/generate.py runs/exact.pt \
        --prompt "ROMEO:" -n 500 --temperature 0.8 --seed 0
"""
import argparse
import sys
import time

from common import DATA, QUICK, add_quick, calibration, fit_options, setup
from favor.models import CharData
from favor.models.conversion import convert_method
from favor.models.training import load_model

QUICK_CHARACTERS = 32


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--prompt", default="\n")
    p.add_argument("-n", type=int, default=500, help="characters to generate")
    p.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--attention", help="convert first: a method (train.py --init --attention)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default 2; --quick: 1)")
    p.add_argument("--data", default=DATA, help="the calibration text of --attention")
    add_quick(p, f"at most {QUICK_CHARACTERS} characters; --attention fitted on "
              f"{QUICK['calibration']} windows, {QUICK['fit_steps']} steps per learned-map fit")
    a = p.parse_args(argv)
    setup(a.threads, a.quick)
    if a.quick:
        a.n = min(a.n, QUICK_CHARACTERS)
    model, ck = load_model(a.checkpoint)
    chars = ck.get("chars")
    if a.attention:
        data = CharData.from_file(a.data, chars=chars)
        calib = calibration(data, model.context, a.seed, a.quick)
        model, _ = convert_method(model, a.attention, calib, seed=a.seed, **fit_options(a.quick))
        model.eval()
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
