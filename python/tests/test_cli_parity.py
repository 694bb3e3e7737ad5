"""The numpy API and the `favor` command line give the same bits on the same .npy inputs and
options: both read float32 (float64 is rounded to float32 the same way, C or Fortran order)
and run the same library code, so every comparison is np.array_equal.

Needs FAVOR_CLI=<build>/tools/favor (skipped otherwise).
"""
import subprocess

import numpy as np
import pytest

import favor
from conftest import rand


def run(cli, *args):
    # The same thread count as this process: with few (batch, head) pairs favor splits one
    # head's keys or queries over threads, and the summation order (so the last bits) then
    # depends on the count (tests/test_threads.cpp: agreement within the 2x-naive rule).
    # Other tests in the process (favor.torch) may have changed it.
    command = [cli, "--threads", str(favor.num_threads()), *map(str, args)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"favor {' '.join(map(str, args))}: {done.stderr}"
    return done


def save(tmp_path, name, array):
    path = tmp_path / name
    np.save(path, array)
    return path


def cli_attention(cli, tmp_path, q, k, v, *options):
    paths = [save(tmp_path, f"{n}.npy", x) for n, x in (("q", q), ("k", k), ("v", v))]
    out = tmp_path / "y.npy"
    run(cli, "attention", "--q", paths[0], "--k", paths[1], "--v", paths[2], "--out", out,
        *options)
    y = np.load(out)
    assert y.dtype == np.float32
    return y


def inputs(rank4=True, nq=33, nk=40, d=8, dv=5, seed=1, dtype=np.float32):
    shape = (lambda n, x: (2, 3, n, x)) if rank4 else (lambda n, x: (n, x))
    norm = d ** 0.25
    return (rand(shape(nq, d), seed, norm, dtype), rand(shape(nk, d), seed + 1, norm, dtype),
            rand(shape(nk, dv), seed + 2, dtype=dtype))


# (CLI options, the same call's keyword arguments) for favor.attention
CASES = {
    "defaults": ([], {}),
    "trig-iid-causal-scale": (["--kernel", "trig", "--projection", "iid", "--features", 32,
                               "--seed", 5, "--scale", 0.3, "--causal"],
                              dict(kernel="trig", projection="iid", features=32, seed=5,
                                   scale=0.3, causal=True)),
    "hyperbolic-radial-quantile": (["--kernel", "hyperbolic", "--projection", "radial",
                                    "--norms", "quantile", "--features", 24, "--seed", 9],
                                   dict(kernel="hyperbolic", projection="radial",
                                        norms="quantile", features=24, seed=9)),
    "favorpp-selffit-sorf": (["--kernel", "favorpp", "--projection", "sorf", "--features", 16],
                             dict(kernel="favorpp", projection="sorf", features=16)),
    "favorpp-fit-a-causal": (["--kernel", "favorpp", "--fit-a", -0.05, "--causal",
                              "--projection", "qmc", "--features", 20, "--seed", 3],
                             dict(kernel="favorpp", fit=-0.05, causal=True, projection="qmc",
                                  features=20, seed=3)),
    "favorsharp-selffit-simplex": (["--kernel", "favorsharp", "--projection", "simplex",
                                    "--norms", "fixed", "--features", 16, "--seed", 2],
                                   dict(kernel="favorsharp", projection="simplex",
                                        norms="fixed", features=16, seed=2)),
    "positive-orthogonal-fixed-seed": (["--norms", "fixed", "--seed", 18446744073709551615,
                                        "--features", 40],
                                       dict(norms="fixed", seed=2**64 - 1, features=40)),
    "exact-f64-causal": (["--method", "exact", "--accumulate", "f64", "--causal"],
                         dict(method="exact", accumulate="f64", causal=True)),
    "exact-f32-scale": (["--method", "exact", "--scale", 0.2], dict(method="exact", scale=0.2)),
}


@pytest.mark.parametrize("rank4", [True, False], ids=["4d", "2d"])
@pytest.mark.parametrize("case", list(CASES))
def test_attention_equals_cli(favor_cli, tmp_path, case, rank4):
    options, kwargs = CASES[case]
    causal = kwargs.get("causal", False)
    q, k, v = inputs(rank4, nk=33 if causal else 40)
    y_cli = cli_attention(favor_cli, tmp_path, q, k, v, *options)
    y = favor.attention(q, k, v, **kwargs)
    assert y.shape == y_cli.shape
    assert np.array_equal(y, y_cli)


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("mask_dtype", [bool, np.uint8, np.int64])
def test_key_mask_equals_cli(favor_cli, tmp_path, causal, mask_dtype):
    q, k, v = inputs(nk=33 if causal else 40, seed=11)
    j = np.arange(k.shape[2])
    mask = np.stack([j % 3 != 1, j % 5 != 4]).astype(mask_dtype)
    mask_path = save(tmp_path, "mask.npy", mask)
    extra = ["--causal"] if causal else []
    y_cli = cli_attention(favor_cli, tmp_path, q, k, v, "--key-mask", mask_path,
                          "--features", 24, *extra)
    assert np.array_equal(favor.attention(q, k, v, key_mask=mask, features=24, causal=causal),
                          y_cli)
    # exact attention with the mask, and 2-D inputs with an [Nk] mask
    y_cli = cli_attention(favor_cli, tmp_path, q, k, v, "--key-mask", mask_path, "--method",
                          "exact", *extra)
    assert np.array_equal(favor.exact_attention(q, k, v, key_mask=mask, causal=causal), y_cli)
    mask_path = save(tmp_path, "mask1.npy", mask[1])
    y_cli = cli_attention(favor_cli, tmp_path, q[0, 0], k[0, 0], v[0, 0], "--key-mask",
                          mask_path, *extra)
    assert np.array_equal(favor.attention(q[0, 0], k[0, 0], v[0, 0], key_mask=mask[1],
                                          causal=causal), y_cli)


@pytest.mark.parametrize("layout", ["float64", "fortran", "float64-fortran"])
def test_converted_inputs_equal_cli(favor_cli, tmp_path, layout):
    # The CLI converts float64 and Fortran-order files to C-order float32; the numpy API
    # rounds float64 the same way and reads Fortran-order float32 in place.
    q, k, v = inputs(seed=21, dtype=np.float64 if "float64" in layout else np.float32)
    if "fortran" in layout:
        q, k, v = (np.asfortranarray(x) for x in (q, k, v))
    for options, kwargs in [([], {}), (["--kernel", "favorsharp", "--features", 16],
                                       dict(kernel="favorsharp", features=16)),
                            (["--method", "exact"], dict(method="exact"))]:
        y_cli = cli_attention(favor_cli, tmp_path, q, k, v, *options)
        assert np.array_equal(favor.attention(q, k, v, **kwargs), y_cli), options


def test_fit_files_equal_fit_kernel(favor_cli, tmp_path):
    # --fit-q/--fit-k: the CLI fits to calibration rows (per head for [B, H, N, D]) with the
    # call's --scale, as favor.fit_kernel(kernel, fit_q, fit_k, scale=...) does.
    q, k, v = inputs(nk=33, seed=31)
    fq, fk = rand((2, 3, 20, 8), 35, 8 ** 0.25), rand((2, 3, 25, 8), 36, 8 ** 0.25)
    fq_path, fk_path = save(tmp_path, "fq.npy", fq), save(tmp_path, "fk.npy", fk)
    for kernel in ("favorpp", "favorsharp"):
        y_cli = cli_attention(favor_cli, tmp_path, q, k, v, "--kernel", kernel, "--causal",
                              "--fit-q", fq_path, "--fit-k", fk_path, "--scale", 0.4,
                              "--features", 16)
        fit = favor.fit_kernel(kernel, fq, fk, scale=0.4)
        assert np.array_equal(favor.attention(q, k, v, kernel=kernel, causal=True, fit=fit,
                                              scale=0.4, features=16), y_cli), kernel


@pytest.mark.parametrize("kind,norms", [("iid", "chi"), ("orthogonal", "chi"),
                                        ("orthogonal", "fixed"), ("radial", "quantile"),
                                        ("qmc", "chi"), ("sorf", "chi"), ("simplex", "chi"),
                                        ("dct", "chi"), ("dct", "quantile")])
def test_save_projection_equals_draw(favor_cli, tmp_path, kind, norms):
    q, k, v = inputs(seed=41)
    w_path = tmp_path / "w.npy"
    y_cli = cli_attention(favor_cli, tmp_path, q, k, v, "--projection", kind, "--norms", norms,
                          "--features", 20, "--seed", 77, "--save-projection", w_path)
    w = favor.Projection.draw(20, 8, kind=kind, norms=norms, seed=77)
    saved = np.load(w_path)
    assert saved.dtype == np.float32 and saved.shape == (20, 8)
    assert np.array_equal(saved, w.matrix)
    assert np.array_equal(favor.attention(q, k, v, projection=w), y_cli)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_projection_file_equals_from_matrix(favor_cli, tmp_path, dtype):
    q, k, v = inputs(seed=51)
    matrix = rand((30, 8), 55, dtype=dtype)
    w_path = save(tmp_path, "w.npy", matrix)
    w = favor.Projection.from_matrix(matrix)
    for options, kwargs in [([], {}), (["--kernel", "trig", "--causal"],
                                       dict(kernel="trig", causal=True)),
                            (["--kernel", "favorpp"], dict(kernel="favorpp"))]:
        qq, kk, vv = (q, q, v[:, :, :q.shape[2]]) if kwargs.get("causal") else (q, k, v)
        y_cli = cli_attention(favor_cli, tmp_path, qq, kk, vv, "--projection-file", w_path,
                              *options)
        assert np.array_equal(favor.attention(qq, kk, vv, projection=w, **kwargs), y_cli)


FEATURE_CASES = {
    "positive": ([], {}),
    "trig-iid": (["--kernel", "trig", "--projection", "iid", "--features", 12, "--seed", 4],
                 dict(kernel="trig", projection="iid", features=12, seed=4)),
    "hyperbolic-scale": (["--kernel", "hyperbolic", "--scale", 0.5, "--features", 10],
                         dict(kernel="hyperbolic", scale=0.5, features=10)),
    "favorpp-fit-a": (["--kernel", "favorpp", "--fit-a", -0.1, "--features", 16],
                      dict(kernel="favorpp", fit=-0.1, features=16)),
}


@pytest.mark.parametrize("rank4", [True, False], ids=["4d", "2d"])
@pytest.mark.parametrize("case", list(FEATURE_CASES))
def test_features_equal_cli(favor_cli, tmp_path, case, rank4):
    options, kwargs = FEATURE_CASES[case]
    x = inputs(rank4, seed=61)[0]
    x_path, out = save(tmp_path, "x.npy", x), tmp_path / "phi.npy"
    run(favor_cli, "features", "--x", x_path, "--out", out, *options)
    phi_cli = np.load(out)
    phi = favor.features(x, **kwargs)
    assert phi.shape == phi_cli.shape and np.array_equal(phi, phi_cli)


def test_features_with_fit_files_and_projection_files(favor_cli, tmp_path):
    x = inputs(seed=71, dtype=np.float64)[0]
    fq, fk = rand((2, 3, 20, 8), 72, 8 ** 0.25), rand((2, 3, 20, 8), 73, 8 ** 0.25)
    paths = {n: save(tmp_path, f"{n}.npy", a) for n, a in (("x", x), ("fq", fq), ("fk", fk))}
    out, w_path = tmp_path / "phi.npy", tmp_path / "w.npy"
    run(favor_cli, "features", "--x", paths["x"], "--out", out, "--kernel", "favorsharp",
        "--fit-q", paths["fq"], "--fit-k", paths["fk"], "--features", 16, "--seed", 8,
        "--save-projection", w_path)
    fit = favor.fit_kernel("favorsharp", fq, fk)
    phi = favor.features(x, kernel="favorsharp", fit=fit, features=16, seed=8)
    assert np.array_equal(phi, np.load(out))
    assert np.array_equal(np.load(w_path), favor.Projection.draw(16, 8, seed=8).matrix)
    run(favor_cli, "features", "--x", paths["x"], "--out", out, "--projection-file", w_path,
        "--kernel", "trig")
    w = favor.Projection.from_matrix(np.load(w_path))
    assert np.array_equal(favor.features(x, kernel="trig", projection=w), np.load(out))


# The CLI's option names and what the same rule calls them in Python.
CLI_NAMES = {"--fit-a": "fit", "--kernel": "kernel", "--method": "method", "--feature-map": "path",
             "--fit-q/--fit-k": "a KernelFit from fit_kernel"}


def cli_error(favor_cli, tmp_path, q, k, v, *options):
    """The message `favor attention` prints for a refused call, its option names written as
    Python's arguments; checks that the call failed with exit code 2 and wrote nothing."""
    paths = [save(tmp_path, f"{n}.npy", x) for n, x in (("q", q), ("k", k), ("v", v))]
    out = tmp_path / "y.npy"
    done = subprocess.run([favor_cli, "attention", "--q", paths[0], "--k", paths[1], "--v",
                           paths[2], "--out", out, *map(str, options)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert not out.exists()
    prefix = "favor: error: "
    assert done.stderr.startswith(prefix), done.stderr
    message = done.stderr[len(prefix):].strip()
    for option, argument in CLI_NAMES.items():
        message = message.replace(option, argument)
    return message


# (CLI options, favor.attention keywords) that both refuse, by the same C++ rule
REFUSED = {
    # the drifted case of issue 24: Python said "one A for every direction is FAVOR++"
    "hedgehog-fit-a": (["--kernel", "hedgehog", "--fit-a", 0.1], dict(kernel="hedgehog", fit=0.1)),
    "positive-fit-a": (["--fit-a", -0.1], dict(fit=-0.1)),
    "trig-fit-a": (["--kernel", "trig", "--fit-a", 0.1], dict(kernel="trig", fit=0.1)),
    "favorsharp-fit-a": (["--kernel", "favorsharp", "--fit-a", 0.1],
                         dict(kernel="favorsharp", fit=0.1)),
    "unknown-kernel": (["--kernel", "gaussian"], dict(kernel="gaussian")),
    "unknown-kernel-exact": (["--method", "exact", "--kernel", "gaussian"],
                             dict(method="exact", kernel="gaussian")),
}


@pytest.mark.parametrize("case", REFUSED)
def test_cli_and_api_refuse_with_the_same_message(favor_cli, tmp_path, case):
    options, kwargs = REFUSED[case]
    q, k, v = inputs(seed=81)
    expected = cli_error(favor_cli, tmp_path, q, k, v, *options)
    with pytest.raises(favor.Error) as e:
        favor.attention(q, k, v, **kwargs)
    assert str(e.value) == expected


def test_the_drifted_fit_message(favor_cli, tmp_path):
    # favor.attention(q, q, q, kernel="hedgehog", fit=0.1), the case issue 24 reports, word
    # for word.
    q = inputs(seed=82)[0]
    with pytest.raises(favor.Error) as e:
        favor.attention(q, q, q, kernel="hedgehog", fit=0.1)
    assert str(e.value) == ("fit: only the favorpp and favorsharp kernels take a fit "
                            "(kernel is hedgehog)")
    assert cli_error(favor_cli, tmp_path, q, q, q, "--kernel", "hedgehog", "--fit-a", 0.1) \
        == str(e.value)


# Feature maps (.npz) cross between Python and the CLI: a map saved by favor.FeatureMap runs
# through `favor attention --feature-map` to the same bits, and a map written by `favor fit`
# loads in Python and gives the CLI's output.
def trained_looking_map(kernel, m, d, heads, seed):
    fm = favor.FeatureMap.learnable(kernel, m, d, heads=heads, seed=seed)
    r = np.random.default_rng(seed)
    fm.weights += 0.1 * r.standard_normal(fm.weights.shape).astype(np.float32)
    fm.bias += 0.1 * r.standard_normal(fm.bias.shape).astype(np.float32)
    fm.lambda_ = (1.0 + 0.3 * r.standard_normal(fm.lambda_.shape)).astype(np.float32)
    return fm


@pytest.mark.parametrize("kernel", ["hedgehog", "positive"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_saved_map_equals_cli_feature_map(favor_cli, tmp_path, kernel, causal):
    q, k, v = inputs(nq=40, nk=40)
    fm = trained_looking_map(kernel, 12, q.shape[-1], q.shape[1], 4)
    path = fm.save(tmp_path / "map.npz")
    options = ["--feature-map", path] + (["--causal", "--decay", "0.9,0.8,0.99"] if causal else [])
    y_cli = cli_attention(favor_cli, tmp_path, q, k, v, *options)
    y = favor.attention(q, k, v, feature_map=favor.FeatureMap.load(path), causal=causal,
                        decay=[0.9, 0.8, 0.99] if causal else None)
    assert np.array_equal(y_cli, y)


def test_cli_fit_map_loads_in_python(favor_cli, tmp_path):
    q, k, v = inputs(nq=48, nk=48)
    paths = [save(tmp_path, f"{n}.npy", x) for n, x in (("q", q), ("k", k), ("v", v))]
    out = tmp_path / "fit.npz"
    run(favor_cli, "fit", "--q", paths[0], "--k", paths[1], "--v", paths[2], "--out", out,
        "--m", 8, "--steps", 5)
    fm = favor.FeatureMap.load(out)
    assert fm.kernel == "hedgehog" and fm.weights.shape == (q.shape[1], 8, q.shape[-1])
    y_cli = cli_attention(favor_cli, tmp_path, q, k, v, "--feature-map", out)
    assert np.array_equal(y_cli, favor.attention(q, k, v, feature_map=fm))


# One distillation fit (favor::fit_features): favor.fit_features is the C++ fit through its
# binding, so on the same sequences, options and seed it gives `favor fit`'s map bit for bit
# and the same history. B = 10 with --holdout 0.25 holds out llround(2.5) = 3 sequences on
# both sides (the one count rule, heldout_count).
@pytest.mark.parametrize("kernel, causal, learn, batch", [
    ("hedgehog", False, "weights,bias,lambda", 2), ("positive", True, "lambda", 2),
    ("hyperbolic", False, "weights,bias", 10)])
def test_python_fit_equals_cli_fit(favor_cli, tmp_path, kernel, causal, learn, batch):
    import json

    d = 6
    q, k = (rand((batch, 2, 20, d), s, d ** 0.25) for s in (31, 32))
    v = rand((batch, 2, 20, 4), 33)
    holdout = 0.5 if batch == 2 else 0.25
    paths = [save(tmp_path, f"{n}.npy", x) for n, x in (("q", q), ("k", k), ("v", v))]
    out = tmp_path / "fit.npz"
    done = run(favor_cli, "fit", "--q", paths[0], "--k", paths[1], "--v", paths[2], "--out", out,
               "--kernel", kernel, "--m", 8, "--seed", 7, "--steps", 6, "--lr", 0.03,
               "--learn", learn, "--holdout", holdout, "--eval-every", 2, "--json",
               *(["--causal"] if causal else []))
    cli_history = json.loads(done.stdout)["history"]
    cli = favor.FeatureMap.load(out)
    fm, history = favor.fit_features(q, k, v, kernel=kernel, features=8, seed=7, steps=6, lr=0.03,
                                     learn=tuple(learn.split(",")), holdout=holdout,
                                     eval_every=2, causal=causal)
    assert (fm.kernel, fm.heads, fm.scale) == (cli.kernel, cli.heads, cli.scale)
    assert np.array_equal(fm.projection, cli.projection)
    for name in ("weights", "bias", "lambda_"):
        a, b = getattr(fm, name), getattr(cli, name)
        assert (a is None) == (b is None), name
        assert a is None or np.array_equal(a, b), name
    assert [(h["step"], h["loss"], h["heldout_error"]) for h in history] == \
        [(h["step"], h["loss"], h["heldout_error"]) for h in cli_history]


@pytest.mark.parametrize("change", ["kernel", "heads", "lambda", "missing"])
def test_malformed_map_file_gives_the_clis_message(favor_cli, tmp_path, change):
    # One reader (src/io/map_file.hpp) for `favor attention --feature-map` and
    # favor.FeatureMap.load: the same message for the same bad file.
    q, k, v = inputs()
    m, d = 6, q.shape[-1]
    z = dict(kernel=np.array("positive", "<U16"), scale=np.array(0.4, "<f8"),
             projection=np.ones((m, d), "<f4"), heads=np.array(1, "<i8"))
    if change == "kernel":
        z["kernel"] = np.array("gaussian", "<U16")
    elif change == "heads":
        z["heads"] = np.array(0, "<i8")
    elif change == "lambda":
        z["lambda"] = np.zeros((1, m), "<f4")
    else:
        del z["scale"]
    path = tmp_path / "bad.npz"
    np.savez(path, **z)
    expected = cli_error(favor_cli, tmp_path, q, k, v, "--feature-map", path)
    with pytest.raises(favor.Error) as e:
        favor.FeatureMap.load(path)
    assert str(e.value) == expected

