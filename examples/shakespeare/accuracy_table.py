"""Accuracy of every favor method on the model's real attention inputs, per layer: runs
`favor accuracy` on each layer's dumped q, k, v (dump_qkv.py) and tabulates the relative
error of the attention output against exact attention at equal state size F (features per
query/key; VQ: codes).

    python examples/shakespeare/dump_qkv.py examples/shakespeare/checkpoints/exact.pt \
        --out runs/qkv
    python examples/shakespeare/accuracy_table.py runs/qkv

Writes QKV/accuracy_{MODE}_layer{L}.json (favor accuracy --json) and QKV/accuracy_{MODE}.md
(MODE: causal with --causal, the model's attention, else bidirectional); prints the
table and the command of every run. Rows: estimator / projection of the `favor` section
(trig and hyperbolic at m = F/2), the `maps` section's FAVOR# and learned maps (WPFF,
positive-fit, hedgehog: distilled on the first half of each sequence; all four evaluated on
the second half; the favor rows on the whole sequence) and Transformer-VQ with C = F codes
(hard and soft, codebook from the first half, evaluated on the second). FAVOR++ / FAVOR# rows are
fitted on the q, k they are scored on (favor accuracy's fit, in causal mode too): an
optimistic, in-sample figure, labelled so. Errors are means over --seeds projection seeds.
--quick is a smoke test of the command line: F = 16 and orthogonal projections unless given,
one seed, and `favor accuracy --quick --kernel-pairs 8` (few Adam and Lloyd steps, two
estimators).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def find_favor(path):
    for p in ([path] if path else []) + [os.path.join(ROOT, "build", "tools", "favor"),
                                         shutil.which("favor")]:
        if p and os.path.exists(p):
            return p
    sys.exit("accuracy_table: the favor CLI was not found; build it (make build) or give --favor")


def run_layer(a, favor, layer):
    mode = "causal" if a.causal else "bidirectional"
    out = os.path.join(a.qkv, f"accuracy_{mode}_layer{layer}.json")
    f = lambda n: os.path.join(a.qkv, f"layer{layer}_{n}.npy")
    feats = sorted({x for F in a.features for x in (F, F // 2)})
    cmd = [favor, "accuracy", "--q", f("q"), "--k", f("k"), "--v", f("v"),
           "--sections", "favor,vq,maps", "--features", *map(str, feats),
           "--projections", *a.projections, "--seeds", str(a.seeds),
           "--maps-features", *map(str, a.features), "--maps-steps", str(a.maps_steps),
           "--vq-codes", *map(str, a.features), "--out", out, "--json"]
    if a.causal:
        cmd.append("--causal")
    if a.quick:  # the kernel MSE (not tabulated here) of 64 x 64 pairs is most of a quick run
        cmd += ["--quick", "--kernel-pairs", "8"]
    print(" ".join(cmd), flush=True)
    if not (a.reuse and os.path.exists(out)):
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(out) as fh:
        return json.load(fh)


def rows_at(res, F):
    """(label, error, std) of every method at F features (or F codes)."""
    rows = []
    for r in res["records"]:
        doubled = r["estimator"] in ("trig", "hyperbolic")
        if r["m"] * (2 if doubled else 1) == F:
            fit = " (in-sample fit)" if r["estimator"] in ("favorpp", "favorsharp") else ""
            rows.append((f"{r['estimator']} / {r['projection']}{fit}",
                         r["attention_rel_error"], r["attention_rel_error_std"]))
    for r in res["maps_records"]:
        if r["features"] == F and r["method"] in ("favor#", "wpff", "positive-fit", "hedgehog"):
            how = ("in-sample fit, 2nd half" if r["method"] == "favor#"
                   else "distilled on 1st half, 2nd half")
            rows.append((f"{r['method']} ({how})", r["attention_rel_error"],
                         r["attention_rel_error_std"]))
    for r in res["vq_records"]:
        if r["codes"] == F:
            kind = "hard" if not r["soft"] else f"soft tau_rel {r['tau_rel']:g}"
            rows.append((f"vq {kind} (2nd half)", r["attention_rel_error"],
                         r["attention_rel_error_std"]))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("qkv", help="the directory of dump_qkv.py")
    p.add_argument("--favor", help="path of the favor CLI (default build/tools/favor)")
    p.add_argument("--features", type=int, nargs="+", default=None,
                   help="state sizes F (default 64 256; --quick: 16)")
    p.add_argument("--projections", nargs="+", default=None,
                   help="default: iid orthogonal qmc radial sorf simplex dct (--quick: "
                   "orthogonal)")
    p.add_argument("--causal", action="store_true",
                   help="causal attention (the model's), else bidirectional")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--maps-steps", type=int, default=200)
    p.add_argument("--reuse", action="store_true", help="reuse existing JSON results")
    p.add_argument("--quick", action="store_true", help="a smoke test (the module docstring)")
    a = p.parse_args(argv)
    if a.features is None:
        a.features = [16] if a.quick else [64, 256]
    if a.projections is None:
        a.projections = (["orthogonal"] if a.quick else
                         ["iid", "orthogonal", "qmc", "radial", "sorf", "simplex", "dct"])
    if a.quick:
        a.seeds = 1
    favor = find_favor(a.favor)
    with open(os.path.join(a.qkv, "meta.json")) as fh:
        meta = json.load(fh)
    results = [run_layer(a, favor, i) for i in range(meta["layers"])]
    lines = [f"Relative error of the attention output against exact attention on the model's "
             f"real q, k, v ({meta['windows']} validation windows of {meta['length']} "
             f"characters, shape {meta['shape']} per layer; "
             f"{'causal' if a.causal else 'bidirectional'} attention; mean over "
             f"{a.seeds} seeds).", ""]
    for F in a.features:
        per_layer = [dict((label, (e, s)) for label, e, s in rows_at(r, F)) for r in results]
        labels = list(dict.fromkeys(label for d in per_layer for label in d))
        head = " | ".join(f"layer {i}" for i in range(len(results)))
        lines += [f"**F = {F}** (features per query and key; VQ: codes)", "",
                  f"| method | {head} | mean |", "|---" + "|---:" * (len(results) + 1) + "|"]
        scored = []
        for label in labels:
            errs = [d.get(label, (float("nan"), 0))[0] for d in per_layer]
            scored.append((sum(errs) / len(errs), label, errs))
        for mean, label, errs in sorted(scored):
            cells = " | ".join(f"{e:.3f}" for e in errs)
            lines.append(f"| {label} | {cells} | {mean:.3f} |")
        lines.append("")
    text = "\n".join(lines)
    mode = "causal" if a.causal else "bidirectional"
    with open(os.path.join(a.qkv, f"accuracy_{mode}.md"), "w") as fh:
        fh.write(text)
    print(text)


if __name__ == "__main__":
    main()
