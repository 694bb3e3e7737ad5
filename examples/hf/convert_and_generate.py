"""A Hugging Face decoder on favor in four steps: load (the shipped character Llama of
examples/hf/char_llama), convert, transfer its attention on training text, generate with a
fixed-size favor state instead of a key-value cache.

    HF_HUB_OFFLINE=1 PYTHONPATH=build/python .venv/bin/python examples/hf/convert_and_generate.py
    ... --method favor# --features 128 --steps 0 --tokens 300
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from char_llama import bits_per_char, load  # noqa: E402

import favor.hf as fh  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--method", default="hedgehog", choices=sorted(fh.METHODS))
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--steps", type=int, default=100, help="transfer steps per layer")
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--prompt", default="ROMEO:\n")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--windows", type=int, default=8, help="calibration windows of 256 chars")
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    print(f"seed {args.seed}")
    model, data = load()
    print(f"original: {bits_per_char(model, data, count=16):.3f} bits per character "
          "(16 validation windows)")
    options = {} if args.method == "exact" else (
        {"codes": args.features} if args.method == "vq" else {"features": args.features})
    print(fh.convert(model, args.method, **options))
    calibration = data.batch("train", args.windows, 256,
                             torch.Generator().manual_seed(args.seed + 2))[0]
    print(fh.transfer(model, [calibration], steps=args.steps))
    print(f"{args.method}: {bits_per_char(model, data, count=16):.3f} bits per character")
    cache = fh.FavorCache() if args.method != "exact" else None
    ids = data.encode(args.prompt)[None]
    out = model.generate(ids, max_new_tokens=args.tokens, do_sample=True, temperature=0.8,
                         top_k=0, cache=cache)
    print(data.decode(out[0]))
    if cache is not None:
        print(f"favor state: {cache.state_bytes} bytes for {cache.get_seq_length()} tokens "
              "(the same for any length)")


if __name__ == "__main__":
    main()
