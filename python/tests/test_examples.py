"""The examples in examples/ run (--quick, ~5-12 s each on 2 cores) and print what they
promise. Each runs as `python SCRIPT --quick` forked from an interpreter that has imported
torch and favor (forked_python.py: a fresh interpreter's start without its imports), with
this process's environment. Every example fixes its seeds, so its output is the same on every
run."""
import pathlib
import re

import forked_python

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
EPS32 = 2.0 ** -23


def run(script, *args, cwd):
    p = forked_python.run([str(EXAMPLES / script), "--quick", *args], cwd=cwd)
    assert p.returncode == 0, f"{script} exited {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p.stdout


def number(pattern, out):
    m = re.search(pattern, out)
    assert m, f"no line matching {pattern!r} in:\n{out}"
    return float(m.group(1))


def check_copy_learnt(out, methods, steps):
    """The output of train_copy.py or train_vq.py: each method has started copying (held-out
    loss below 0.5, chance being log(16) = 2.77; token accuracy >= 90%) and the training
    curve is printed up to its last row, step `steps`."""
    assert "seed 0" in out
    for method in methods:
        loss = number(rf"{method}: final loss ([0-9.]+)", out)
        acc = number(rf"{method}: final loss [0-9.]+  token accuracy ([0-9.]+)%", out)
        assert loss < 0.5, (method, loss)
        assert acc >= 90.0, (method, acc)
    assert re.search(rf"^\s+{steps}\s+[0-9.]+\s+[0-9.]+$", out, re.M), out


def test_train_copy(tmp_path):
    out = run("train_copy.py", cwd=tmp_path)
    # --quick trains 100 steps: both models have started copying (measured held-out loss
    # 0.031 favor, 0.027 exact; chance is log(16) = 2.77), and the curve is printed.
    check_copy_learnt(out, ("favor", "exact"), 100)


def test_convert_encoder(tmp_path):
    plot = tmp_path / "error_vs_m.png"
    out = run("convert_encoder.py", "--plot", str(plot), cwd=tmp_path)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 10_000
    for m in (16, 64, 256, 1024):
        assert re.search(rf"^\s+{m}\s+\d", out, re.M), f"no row for m={m}:\n{out}"
    # method='exact' differs from torch's attention by float32 rounding only: two layers of
    # sums over 64 terms, a few hundred eps at most (measured 1.5e-7, ~1.3 eps).
    exact = number(r"method='exact' relative error: ([0-9.e+-]+)", out)
    assert exact < 256 * EPS32, exact
    # With small q.k (the control) the estimator's error falls at the Monte Carlo rate
    # m^-1/2: measured slope -0.45 over m = 16..1024; [-0.6, -0.4] allows the spread of
    # 2 seeds x 64 sequences. The trained model's own layer falls far more slowly (-0.11):
    # heavy-tailed features at its q, k norms (see the example's docstring).
    control = number(r"slope of the mean control error from m=16 to m=1024: ([0-9.+-]+)", out)
    assert -0.6 <= control <= -0.4, control
    attn = number(r"slope of the mean layer-0 attention error from m=16 to m=1024: ([0-9.+-]+)",
                  out)
    assert -0.4 < attn < 0, attn


def test_stream_decode(tmp_path):
    out = run("stream_decode.py", cwd=tmp_path)
    assert "all checks passed" in out, out
    # Stepwise logits equal the full forward pass up to float32 rounding. The example's
    # tolerance is 4 * positions * eps * max|logit| (a recursive sum's rounding bound,
    # carried through the layers: 8e-5 and 3e-4 here); the difference must also be below
    # 1e-4 in absolute terms, so that a wrong state (a missed token, a stale projection)
    # could not hide under a loose bound: such bugs move logits by 1e-2 and more, the
    # measured difference is 1e-6 to 2.4e-6 (~10-20 ulps of the logits).
    pattern = (r"{}: max \|step - forward\| over \d+ positions = ([0-9.e+-]+) "
               r"\(tolerance ([0-9.e+-]+)\)")
    for label in ("copy model", r"random weights, \d+ tokens"):
        m = re.search(pattern.format(label), out)
        assert m, f"no difference line for {label}:\n{out}"
        diff, tol = float(m.group(1)), float(m.group(2))
        assert diff <= min(tol, 1e-4), (label, diff, tol)
    assert number(r"copied tokens right: ([0-9.]+)%", out) >= 90.0
    assert re.search(r"state_bytes per layer \[\d+, \d+\] at every one of \d+ steps: constant",
                     out), out
    assert number(r"features 64: ([0-9]+) tokens/s", out) > 0
    assert number(r"one forward\(\) over all \d+ positions: ([0-9.]+) ms", out) > 0


def test_train_vq(tmp_path):
    out = run("train_vq.py", cwd=tmp_path)
    # --quick trains 150 steps: both models copy (measured held-out loss 0.057 vq, 0.0079
    # exact, token accuracy 99.9% / 100%; chance is log(16) = 2.77); VQ learns later (its
    # codebooks must first separate the positions) and reports its dead codes.
    check_copy_learnt(out, ("vq", "exact"), 150)
    assert re.search(r"dead codes per layer \(of 128\): held-out \[\d+, \d+\]", out), out


def test_fit_hedgehog(tmp_path):
    out = run("fit_hedgehog.py", "--out", str(tmp_path / "map.npz"), cwd=tmp_path)
    assert "seed 0" in out
    # --quick: 80 Adam steps on 6 structured sequences (m = 32, D = 16). Measured held-out
    # error 0.334 (output) and 0.349 (kl) from 0.832 at the start, 3.0x and 2.8x below
    # FAVOR+ at equal feature count (0.992): the fitted map must be at least 2x better.
    for objective in ("output", "kl"):
        ratio = number(rf"hedgehog \({objective}\) final held-out error [0-9.]+: ([0-9.]+)x "
                       r"lower than FAVOR\+ at equal F", out)
        assert ratio >= 2.0, (objective, ratio)
    assert "reloaded map gives identical outputs" in out, out
    assert (tmp_path / "map.npz").stat().st_size > 0


def test_the_examples_run_forked_from_the_preloaded_interpreter(tmp_path):
    """forked_python.run: the script runs in a child of the server (torch already imported,
    argv, exit status and output as `python` gives them); a changed environment gets a fresh
    interpreter (nothing imported)."""
    script = tmp_path / "s.py"
    script.write_text("import os, sys\nprint('torch' in sys.modules, sys.argv[1:], "
                      "os.getcwd() == sys.argv[1])\nsys.exit(3)\n")
    forked = forked_python.run([str(script), str(tmp_path)], cwd=tmp_path)
    assert forked.returncode == 3 and forked.stdout.split() == ["True", f"['{tmp_path}']", "True"]
    fresh = forked_python.run([str(script), str(tmp_path)], cwd=tmp_path,
                              env={"FAVOR_FORKSERVER_TEST": "1"})
    assert fresh.returncode == 3 and fresh.stdout.split() == ["False", f"['{tmp_path}']", "True"]
