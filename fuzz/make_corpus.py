#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (fuzz/corpus/<target>/), reproducibly.

Run from anywhere with the project venv: .venv/bin/python fuzz/make_corpus.py
The outputs are committed; `make fuzz` copies them into build-fuzz/ and lets libFuzzer grow
the copy, never these files.
"""
import io
import os
import shutil
import struct
import zipfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")


def npy(array, version=None, fortran=False):
    """The .npy bytes of `array` (format version 1.0 unless asked for 2.0 / 3.0)."""
    a = np.asfortranarray(array) if fortran else np.ascontiguousarray(array)
    buf = io.BytesIO()
    if version is None:
        np.lib.format.write_array(buf, a)
    else:
        np.lib.format.write_array(buf, a, version=version)
    return buf.getvalue()


def npz(members, compressed=False):
    buf = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buf, **members)
    return buf.getvalue()


def fit_map(heads=2, m=4, d=3, kernel="hedgehog", seed=0):
    """A map file as favor writes it (src/io/map_file.hpp): np.savez of these members."""
    rng = np.random.RandomState(seed)
    return {
        "kernel": np.array(kernel, dtype="<U16"),
        "scale": np.array(1 / np.sqrt(d), dtype="<f8"),
        "projection": rng.randn(m, d).astype("<f4"),
        "heads": np.array(heads, dtype="<i8"),
        "weights": rng.randn(heads, m, d).astype("<f4"),
        "bias": (0.1 * rng.randn(heads, m)).astype("<f4"),
        "lambda": (1 + 0.1 * rng.rand(heads, m)).astype("<f4"),
    }


def write(target, name, data):
    path = os.path.join(CORPUS, target, name)
    with open(path, "wb") as f:
        f.write(data)


def npy_seeds():
    rng = np.random.RandomState(1)
    x = rng.randn(2, 3)
    seeds = {
        "f4_2d.npy": npy(x.astype("<f4")),
        "f8_2d.npy": npy(x.astype("<f8")),
        "f4_big_endian.npy": npy(x.astype(">f4")),
        "f8_big_endian.npy": npy(x.astype(">f8")),
        "f2.npy": npy(x.astype("<f2")),
        "f4_fortran.npy": npy(rng.randn(3, 4).astype("<f4"), fortran=True),
        "f4_4d.npy": npy(rng.randn(1, 2, 3, 2).astype("<f4")),
        "f4_empty.npy": npy(np.zeros((0, 3), "<f4")),
        "f4_1d.npy": npy(rng.randn(5).astype("<f4")),
        "f4_v2.npy": npy(x.astype("<f4"), version=(2, 0)),
        "f4_v3.npy": npy(x.astype("<f4"), version=(3, 0)),
        "f4_nan_inf.npy": npy(np.array([np.nan, np.inf, -np.inf, 1e-45], "<f4")),
        "f8_scalar.npy": npy(np.array(0.5, "<f8")),
        "f4_scalar.npy": npy(np.array(2.0, "<f4")),
        "i8_scalar.npy": npy(np.array(3, "<i8")),
        "u8_scalar.npy": npy(np.array(2**63, "<u8")),
        "i1_scalar.npy": npy(np.array(-2, "|i1")),
        "b1_mask.npy": npy(np.array([[True, False, True]])),
        "i4_array.npy": npy(np.arange(6, dtype="<i4").reshape(2, 3)),
        "u1_array.npy": npy(np.arange(4, dtype="|u1")),
        "U16_scalar.npy": npy(np.array("hedgehog", dtype="<U16")),
        "U3_array.npy": npy(np.array(["ab", "c"], dtype="<U3")),
        "object.npy": npy(np.array(["x"], dtype="<U1")).replace(b"<U1", b"|O8"),
    }
    whole = npy(x.astype("<f4"))
    seeds["f4_truncated_data.npy"] = whole[:-5]
    seeds["f4_truncated_header.npy"] = whole[:40]
    return seeds


def npz_seeds():
    rng = np.random.RandomState(2)
    plain = {"q": rng.randn(2, 3).astype("<f4"), "k": rng.randn(2, 3).astype("<f8")}
    seeds = {
        "savez.npz": npz(plain),
        "savez_compressed.npz": npz(plain, compressed=True),
        "map_hedgehog.npz": npz(fit_map()),
        "map_hedgehog_compressed.npz": npz(fit_map(), compressed=True),
        "map_positive_plain.npz": npz({k: v for k, v in fit_map(heads=1, kernel="positive").items()
                                       if k in ("kernel", "scale", "projection", "heads")}),
        "map_trig.npz": npz(fit_map(heads=1, kernel="trig", m=2, d=2)),
        # Loaders that take a path (the non-zip inputs of fuzz_npz):
        "codebook_2d.npy": npy(rng.randn(2, 3).astype("<f4")),
        "codebook_3d.npy": npy(rng.randn(2, 2, 3).astype("<f4")),
        "feature_weights.npy": npy((1 + rng.rand(4)).astype("<f4")),
        "projection.npy": npy(rng.randn(4, 3).astype("<f8")),
        "tensor_4d.npy": npy(rng.randn(1, 2, 4, 3).astype("<f4")),
        "mask.npy": npy(np.array([[True, False, True, True]])),
    }
    whole = seeds["map_hedgehog.npz"]
    seeds["map_truncated.npz"] = whole[: len(whole) // 2]
    # A zip64 archive (the reader understands zip64 records).
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
        for name, array in fit_map(heads=1, kernel="positive").items():
            with z.open(name + ".npy", "w", force_zip64=True) as f:
                f.write(npy(array))
    seeds["map_zip64.npz"] = buf.getvalue()
    return seeds


def cli_seeds():
    att = ["attention", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy"]
    att2 = ["attention", "--q", "q2.npy", "--k", "k2.npy", "--v", "v2.npy", "--out", "o.npy"]
    argvs = {
        "attention": att,
        "attention_rank2": att2 + ["--features", "8"],
        "attention_causal_decay": att + ["--causal", "--decay", "0.9,0.5"],
        "attention_exact_f64": att + ["--method", "exact", "--accumulate", "f64", "--scale", "0.5"],
        "attention_mask": att + ["--key-mask", "mask.npy", "--kernel", "trig"],
        "attention_mask2": att2 + ["--key-mask", "mask2.npy", "--kernel", "hyperbolic"],
        "attention_projection_file": att2 + ["--projection-file", "w.npy", "--save-projection", "p.npy"],
        "attention_feature_map": att + ["--feature-map", "map.npz"],
        "attention_feature_weights": att2 + ["--features", "4", "--feature-weights", "lw.npy"],
        "attention_favorpp": att + ["--kernel", "favorpp", "--fit-a", "-0.1", "--causal"],
        "attention_favorsharp_fit": att + ["--kernel", "favorsharp", "--fit-q", "q.npy", "--fit-k", "k.npy"],
        "attention_vq": att + ["--method", "vq", "--codes", "2", "--save-codebook", "c.npy"],
        "attention_vq_codebook": att + ["--method", "vq", "--codebook", "cb3.npy", "--causal", "--vq-block", "2"],
        "attention_vq_soft": att2 + ["--method", "vq", "--codebook", "cb.npy", "--vq-tau", "0.5"],
        "attention_f64": ["attention", "--q", "f64.npy", "--k", "f64.npy", "--v", "f64.npy", "--out", "o.npy"],
        "attention_threads": ["--threads", "2"] + att,
        "features": ["features", "--x", "q2.npy", "--out", "phi.npy", "--kernel", "hyperbolic", "--features", "8"],
        "features_projection": ["features", "--x", "q.npy", "--out", "phi.npy", "--projection", "sorf", "--norms", "fixed", "--seed", "7"],
        "codebook": ["codebook", "--k", "k.npy", "--codes", "2", "--out", "cb_out.npy", "--shared", "--key-mask", "mask.npy"],
        "codebook_rank2": ["codebook", "--k", "k2.npy", "--codes", "3", "--out", "cb_out.npy", "--iterations", "2", "--seed", "3"],
        "fit": ["fit", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", "m.npz", "--steps", "3", "--features", "4"],
        "fit_hedgehog": ["fit", "--q", "q2.npy", "--k", "k2.npy", "--v", "v2.npy", "--out", "m.npz", "--steps", "2",
                         "--kernel", "hedgehog", "--learn", "weights,bias", "--causal", "--json"],
        "fit_heldout": ["fit", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", "m.npz", "--steps", "2",
                        "--heldout-q", "q.npy", "--heldout-k", "k.npy", "--heldout-v", "v.npy", "--eval-every", "1"],
        "bench": ["bench", "--lengths", "8,16", "--json", "--features", "4"],
        "accuracy": ["accuracy", "--n", "8", "--d", "4", "--features", "4,8", "--estimators", "positive"],
        "demo": ["demo", "--lengths", "8", "--json"],
        "help": ["attention", "--help"],
        "version": ["--version"],
    }
    return {name: b"\0".join(a.encode() for a in argv) for name, argv in argvs.items()}


def attention_seeds():
    """Byte strings for fuzz_attention (fuzz_attention.cpp reads them in this order): op, B, H,
    Nq, D, Dv, m, causal, Nk, (causal: 1 = Nk := Nq), no shape bent (15), then per tensor a
    stride byte (0: contiguous) and a value pattern (its length, palette entries)."""
    rng = np.random.RandomState(3)
    seeds = {}
    for op in range(9):
        for variant in range(3):
            causal = variant == 1
            head = [op, 1 + variant % 2, 2, 4, 3, 3, 4, causal, 4] + ([1] if causal else []) + [15]
            tail = []
            for _ in range(3):  # q, k, v: contiguous (variant 2: random strides), 8 values
                tail += [0 if variant < 2 else rng.randint(256), 7]
                tail += rng.randint(0, 16, size=8).tolist()  # palette 0..15: ordinary values
            tail += rng.randint(0, 16, size=24).tolist()  # mask, options, the rest
            seeds["op%d_%d.bin" % (op, variant)] = bytes(head + tail)
    return seeds


def main():
    for target, seeds in (("npy", npy_seeds()), ("npz", npz_seeds()), ("cli", cli_seeds()),
                          ("attention", attention_seeds())):
        folder = os.path.join(CORPUS, target)
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        for name, data in sorted(seeds.items()):
            write(target, name, data)
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(CORPUS) for f in fs)
    print("fuzz/corpus: %d bytes" % total)


if __name__ == "__main__":
    main()
