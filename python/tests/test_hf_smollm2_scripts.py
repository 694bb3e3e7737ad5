"""The distillation-at-scale scripts of examples/hf (issue 47): the calibration corpus
(examples/hf/corpus.py: deduplication, the held-out split, packing, the token cache) and
scripts/gpu-distill.sh run on the CPU with SmolLM2's first 2 layers (--quick), so that its
first GPU run is not its first run: it writes the adapter and train.json, stops on time and
resumes; bad arguments exit 2 with one line. And the issue-48 study tables, which the docs
quote exactly as the study scripts print them from their results files."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import forked_python

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "examples", "hf"))
sys.path.insert(0, os.path.join(ROOT, "examples", "hf", "smollm2"))
import corpus  # noqa: E402
import smollm2  # noqa: E402


def test_dedup_drops_repeated_paragraphs_across_documents():
    d = corpus.Dedup()
    para = "This paragraph is long enough to be compared with the others seen."
    first = d(f"{para}\n\nshort\n\nAnother paragraph, also long enough to count here.")
    again = d(f"{para.upper()}\n\n  short  \n\nA third paragraph that nobody has seen so far.")
    assert first.count(para) == 1 and para not in again and d.dropped == 1
    assert "short" in again  # short paragraphs (structure) are kept
    assert "A third paragraph" in again


def test_the_held_out_split_is_a_fixed_tenth():
    ids = [f"doc {i}" for i in range(5000)]
    held = [corpus.held_out(i, "man-pages") for i in ids]
    assert held == [corpus.held_out(i, "man-pages") for i in ids]  # deterministic
    assert 0.08 < sum(held) / len(held) < 0.12
    assert corpus.held_out("held 3", "python-stdlib") and not corpus.held_out("cal 3",
                                                                               "python-stdlib")


@pytest.fixture(scope="module")
def tok():
    import transformers
    return transformers.AutoTokenizer.from_pretrained(smollm2.folder(), gguf_file=smollm2.GGUF)


def test_the_corpus_is_tokenised_once_packed_and_mixed(tok, tmp_path):
    folder = str(tmp_path / "c")
    built = corpus.build(tok, folder, cap=40_000, sources=["shakespeare", "java-source"],
                         progress=False)
    meta = json.load(open(os.path.join(folder, "corpus.json")))
    assert set(meta["sources"]) <= {"shakespeare", "java-source"}
    assert "shakespeare" in meta["sources"]
    for name, m in meta["sources"].items():
        assert m["licence"] and 40_000 <= m["tokens_cal"] < 40_000 + 20_000
        cal = built.ids(name, "cal")
        assert cal.dtype == np.int32 and cal.size == m["tokens_cal"]
        assert (cal == tok.eos_token_id).sum() >= 1  # documents joined by EOS
    stamp = os.path.getmtime(os.path.join(folder, "shakespeare.cal.npy"))
    again = corpus.build(tok, folder, cap=40_000, sources=["shakespeare", "java-source"])
    assert os.path.getmtime(os.path.join(folder, "shakespeare.cal.npy")) == stamp  # read back
    windows = again.calibration(128, seed=3)
    streams = {n: built.ids(n, "cal") for n in meta["sources"]}
    assert windows.shape[1] == 128
    assert windows.shape[0] == sum(s.size // 128 for s in streams.values())
    # each window is a run of consecutive stream tokens (packing: no padding, no restart)
    for row in windows[:5]:
        found = False
        for s in streams.values():
            starts = np.flatnonzero(s[:s.size - 127] == int(row[0]))
            found |= any(np.array_equal(s[a:a + 128], row.numpy()) for a in starts)
        assert found
    assert torch.equal(again.calibration(128, seed=3), windows)  # seeded order
    if len(streams) == 2:  # mixed: the first windows are not all one source's
        first = [any(np.array_equal(r.numpy(), s[i:i + 128]) for i in range(0, s.size - 127, 128))
                 for r in windows[:20] for s in [streams["shakespeare"]]]
        assert 0 < sum(first) < 20


def _run(*args, timeout=600):
    env = dict(os.environ, PYTHON=sys.executable)
    return subprocess.run([os.path.join(ROOT, "scripts", "gpu-distill.sh"), *args],
                          capture_output=True, text=True, env=env, timeout=timeout)


def test_gpu_distill_refuses_bad_arguments(tmp_path):
    for args in ([], ["3"], ["0", str(tmp_path)], ["ten", str(tmp_path)], ["-1", "x"]):
        r = _run(*args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and not r.stdout
    assert not os.listdir(tmp_path)


def test_gpu_distill_runs_on_the_cpu_stops_on_time_and_resumes(tmp_path):
    out = str(tmp_path / "run")
    quick = ["--quick", "--data", "stdlib", "--method", "window", "--length", "64",
             "--calibration-windows", "8"]
    first = _run("0.2", out, *quick)  # ~20 steps of 0.5 s
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "cuda False" in first.stdout and "plan:" in first.stdout
    log = json.load(open(os.path.join(out, "train.json")))
    plan = json.load(open(os.path.join(out, "plan.json")))
    assert log["device"] == "cpu" and log["distill"]["steps"] == plan["steps"] >= 1
    assert log["distill"]["precision"] in ("bf16", "float32")
    assert set(log["held_out_kl"]) == {"python-stdlib"}
    assert os.path.exists(os.path.join(out, "adapter", "favor_adapter.safetensors"))
    done = log["distill"]["done"]
    second = _run("0.2", out, *quick)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    log2 = json.load(open(os.path.join(out, "train.json")))
    assert log2["distill"]["steps"] == plan["steps"]  # the plan is kept
    assert log2["distill"]["resumed_at"] == done and log2["distill"]["done"] >= done
    assert log2["earlier"]["distill"]["done"] == done


def test_train_runs_a_gated_hybrid_with_a_softmax_layer(tmp_path):
    """train.py --gate --softmax-layers (issue 48): layer 1 of the 2 stays on softmax, layer
    0 is a gated positive-fit hybrid; train.json reports its gates; the adapter keeps the
    plan."""
    out = str(tmp_path / "gated")
    r = forked_python.run([os.path.join(ROOT, "examples", "hf", "smollm2", "train.py"),
                           "--out", out, "--quick", "--data", "stdlib", "--method",
                           "positive-fit", "--features", "16", "--gate", "1e-3",
                           "--softmax-layers", "1", "--length", "64", "--calibration-windows",
                           "8", "--precision", "float32", "--threads", "1"], timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    log = json.load(open(os.path.join(out, "train.json")))
    assert list(log["gates"]) == ["0"] and len(log["gates"]["0"]) == 9
    assert log["options"]["softmax_layers"] == [1]
    saved = json.load(open(os.path.join(out, "adapter", "favor_adapter.json")))
    assert saved["favor"]["softmax_layers"] == [1] and saved["favor"]["gate"] == 1e-3


def _script(name):
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "smollm2_" + name, os.path.join(ROOT, "examples", "hf", "smollm2", name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _quoted(table, rows, *docs):
    assert table.count("\n") == len(rows) + 1
    for doc in docs:
        with open(os.path.join(ROOT, doc)) as f:
            assert table in f.read(), doc


def test_the_docs_quote_the_long_range_study_as_measured():
    """docs/hf.md and the SmolLM2 README carry the issue-48 study tables exactly as
    longrange.py --table and hybrid_start.py --table print them from results/."""
    results = os.path.join(ROOT, "examples", "hf", "smollm2", "results")
    with open(os.path.join(results, "longrange-study.json")) as f:
        out = json.load(f)
    _quoted(_script("longrange").study_table(out), out["rows"], "docs/hf.md",
            "examples/hf/smollm2/README.md")
    with open(os.path.join(results, "hybrid_start.json")) as f:
        out = json.load(f)
    _quoted(_script("hybrid_start").table(out), out["rows"], "examples/hf/smollm2/README.md")
    # issue 49: generate()'s process memory at 1k-8k (longrange.py --process-lengths)
    for name in ("memory.json", "memory_zen3.json"):  # (the second: weights read in first,
        with open(os.path.join(results, name)) as f:  # medians of 3 rounds)
            out = json.load(f)
        _quoted(_script("longrange").memory_table(out), out["process_lengths"], "docs/hf.md")


def test_the_docs_quote_the_untrained_study_as_measured():
    """The held-out perplexity table of study.py (results/study.json, study.tables) is quoted
    exactly in docs/hf.md and the SmolLM2 README, and so are the untrained figures hf.md's
    prose cites (the window alone, FAVOR+ alone, against the original)."""
    import re
    results = os.path.join(ROOT, "examples", "hf", "smollm2", "results")
    with open(os.path.join(results, "study.json")) as f:
        res = json.load(f)
    table = _script("study").tables({"ppl": res["ppl"]}).strip()
    for doc in ("docs/hf.md", "examples/hf/smollm2/README.md"):
        with open(os.path.join(ROOT, doc)) as f:
            assert table in f.read(), doc
    rows = {r["model"]: r["ppl_1024"] for r in res["ppl"]}
    with open(os.path.join(ROOT, "docs", "hf.md")) as f:
        prose = " ".join(f.read().split())
    m = re.search(r"sinks alone is ([0-9.]+)x the original perplexity and FAVOR\+ alone "
                  r"([0-9.]+)x", prose)
    assert m, "hf.md no longer cites the untrained window and FAVOR+"
    base = rows["original (sdpa)"]
    assert m.group(1) == f"{rows['window + sinks'] / base:.3f}"
    assert m.group(2) == f"{rows['favor'] / base:.3f}"


def test_the_docs_state_the_shipped_adapters_sizes_as_they_are():
    """Every size quoted for a shipped adapter folder (`name/` (X MiB)) is its size on disk,
    in MiB to one decimal."""
    import re
    folder = os.path.join(ROOT, "examples", "hf", "smollm2")
    seen = 0
    for doc in ("README.md", "docs/hf.md", "examples/hf/smollm2/README.md"):
        with open(os.path.join(ROOT, doc)) as f:
            text = f.read()
        for name, size in re.findall(r"`(?:examples/hf/smollm2/)?([a-z0-9-]+)/`\*{0,2} \(([0-9.]+) MiB",
                                     text):
            path = os.path.join(folder, name)
            total = sum(os.path.getsize(os.path.join(d, x)) for d, _, xs in os.walk(path)
                        for x in xs)
            assert size == f"{total / 2**20:.1f}", (doc, name, size)
            seen += 1
    assert seen >= 4


def test_the_process_memory_warm_up_must_be_shorter_than_the_prompt():
    """longrange.py --rss-warm K: a warm-up on the whole prompt would put what the measured
    call allocates into the baseline; refused before anything loads."""
    with pytest.raises(SystemExit, match="--rss-warm: 64 must be below the prompt's 64 tokens"):
        _script("longrange").rss_worker("original", (), 64, 16, 1, warm=64)
