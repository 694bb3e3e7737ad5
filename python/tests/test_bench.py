"""python3 -m favor.bench --quick --json: the document's structure and that every figure is
finite (and positive, except the overheads, which are differences of two timings). No
assertion on the timings themselves: the machine may be busy. Then the helpers of the sdpa
section (crossover, the budgeted timer) on synthetic inputs."""
import json
import math
import os
import subprocess
import sys

import pytest

from favor import bench_helpers as bh

IMPLS = {"favor", "torch_favor_plus", "softmax"}
PASSES = {"fwd", "fwd+bwd"}
DIFFERENCES = {"numpy_overhead_us", "torch_overhead_us", "torch_over_numpy_us"}
NONNEGATIVE = {"warmup"}  # 0: a warm-up longer than the budget was the only run
SDPA_IMPLS = {"sdpa", "favor", "favor_exact"}
CALL_IMPLS = ("cpp", "core", "numpy", "torch", "sdpa")


@pytest.fixture(scope="module")
def doc():
    run = subprocess.run([sys.executable, "-m", "favor.bench", "--quick", "--json"],
                         capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def numbers(record):
    """(key, value) of every numeric figure of a record, list items included."""
    for key, value in record.items():
        values = value if isinstance(value, list) else [value]
        for x in values:
            if isinstance(x, (int, float)) and not isinstance(x, bool):
                yield key, x


def test_meta(doc):
    meta = doc["meta"]
    for key in ("torch_threads", "favor_threads", "build_info", "torch_version", "machine",
                "softmax", "repeats", "b", "h", "d", "m", "loadavg_start", "loadavg_end"):
        assert key in meta, key
    assert meta["torch_threads"] == meta["favor_threads"] == 2
    assert meta["complete"] is True
    assert meta["build_info"].startswith("favor ")
    assert {"platform", "cpu", "logical_cpus"} <= set(meta["machine"])


def test_attention_records_cover_every_case(doc):
    att = [r for r in doc["records"] if r["section"] == "attention"]
    lengths = {r["n"] for r in att}
    assert len(lengths) >= 2
    seen = {(r["impl"], r["pass"], r["causal"], r["n"]) for r in att}
    assert seen == {(i, p, c, n) for i in IMPLS for p in PASSES for c in (False, True)
                    for n in lengths}
    for r in att:
        assert "skipped" not in r, r  # the quick sizes always fit
        assert len(r["times"]) == doc["meta"]["repeats"]
        assert r["bh"] == r["b"] * r["h"] == 8
        if r["impl"] == "favor":
            assert {"speedup_vs_torch_favor_plus", "speedup_vs_softmax"} <= set(r)
        if r["impl"] == "softmax":
            assert r["groups"] >= 1 and r["heads_per_group"] >= 1


def test_overhead_and_oversubscription_records(doc):
    ov = [r for r in doc["records"] if r["section"] == "overhead"]
    assert {r["causal"] for r in ov} == {False, True} and len(ov) >= 2
    for r in ov:
        assert {"cpp_us", "numpy_us", "torch_us", "numpy_overhead_us",
                "torch_overhead_us"} <= set(r)
    osub = [r for r in doc["records"] if r["section"] == "oversubscription"]
    assert {r["causal"] for r in osub} == {False, True}
    for r in osub:
        assert r["oversubscribed_threads"] > r["favor_threads"] == r["torch_threads"]


def test_every_figure_is_finite_and_positive(doc):
    for r in doc["records"]:
        for key, x in numbers(r):
            assert math.isfinite(x), (key, r)
            if key in NONNEGATIVE:
                assert x >= 0, (key, r)
            elif key not in DIFFERENCES:
                assert x > 0, (key, r)


def test_sdpa_meta_names_the_kernel_that_ran(doc):
    meta = doc["meta"]
    assert meta["sdpa"] == "torch.nn.functional.scaled_dot_product_attention"
    assert set(meta["sdpa_kernels"]) == {"bidir", "causal"}
    for ops in meta["sdpa_kernels"].values():
        assert set(ops) == {"fwd", "fwd+bwd"}
        assert all(any("scaled_dot_product" in o for o in names) for names in ops.values())
    assert "seeds" in meta and meta["sdpa_sizes"]["b"] * meta["sdpa_sizes"]["h"] == 8


def test_sdpa_records_cover_every_case(doc):
    att = [r for r in doc["records"] if r["section"] == "sdpa"]
    lengths = {r["n"] for r in att}
    assert len(lengths) >= 2
    seen = {(r["impl"], r["pass"], r["causal"], r["n"]) for r in att}
    assert seen == {(i, p, c, n) for i in SDPA_IMPLS for p in PASSES for c in (False, True)
                    for n in lengths}  # --quick runs favor's exact kernel at every N
    for r in att:
        assert r["bh"] == r["b"] * r["h"] == 8 and r["d"] == 64
        assert r["threads"] == 2 and r["favor_threads"] == 2
        assert 1 <= len(r["times"]) <= doc["meta"]["repeats"]
        assert r["gflop_per_s"] > 0 and r["tokens_per_s"] > 0
        if r["impl"] == "sdpa":
            assert r["backend"] in (None, "FLASH_ATTENTION", "MATH")
        else:
            assert r["speedup_vs_sdpa"] > 0
            if r["pass"] == "fwd" and r["impl"] == "favor_exact":  # the same inputs
                assert r["rel_error_vs_sdpa"] < 1e-4  # (FAVOR+'s is large on N(0, 1) q, k)


def test_sdpa_summary_per_mask_and_pass(doc):
    summ = [r for r in doc["records"] if r["section"] == "sdpa_summary"]
    assert {(r["causal"], r["pass"]) for r in summ} == {(c, p) for c in (False, True)
                                                        for p in PASSES}
    for r in summ:
        assert isinstance(r["crossover"], str) and r["crossover"]
        assert r["crossover_n"] is None or r["crossover_n"] > 0
        assert "ratio_4096" in r and "ratio_16384" in r  # None: not in the --quick sweep


def test_call_records(doc):
    calls = [r for r in doc["records"] if r["section"] == "call"]
    assert {(r["causal"], r["n"]) for r in calls} == {(c, n) for c in (False, True)
                                                      for n in (1, 8)}
    for r in calls:
        assert r["shape"] == [1, 8, r["n"], 64]  # --call-heads 8
        for impl in CALL_IMPLS:
            assert r[impl + "_us"] > 0 and r[impl + "_min_us"] <= r[impl + "_us"]
        assert r["torch_overhead_us"] == pytest.approx(r["torch_us"] - r["cpp_us"])


def test_tables_print_every_section():
    run = subprocess.run([sys.executable, "-m", "favor.bench", "--quick", "--sections", "sdpa",
                          "call", "--mask", "causal"],
                         capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert run.returncode == 0, run.stderr
    for header in ("| mask | pass | N | SDPA ms |", "crossover N", "| mask | N | C++ timer us"):
        assert header in run.stdout, run.stdout
    assert "plain-torch FAVOR+" not in run.stdout  # the attention section did not run


@pytest.mark.parametrize("points, n, note", [
    ([(256, 0.5), (512, 2.0)], 362.04, "interpolated between N = 256 and 512"),
    ([(256, 0.5), (512, 2.0), (1024, 0.9), (2048, 1.1)], None, "between N = 1024 and 2048"),
    ([(256, 1.5), (512, 2.0)], None, "favor faster at every N (from N = 256)"),
    ([(256, 0.5), (512, 0.8)], None, "none up to N = 512"),
    ([], None, "no points"),
])
def test_crossover(points, n, note):
    got, text = bh.crossover(points)
    assert note in text
    if n is not None:
        assert got == pytest.approx(n, rel=1e-4)
    if len(points) == 4:  # the last crossing counts: favor stays faster above it
        assert 1024 < got < 2048


def test_budget_seconds_keeps_a_long_warmup_as_the_only_run():
    calls = []
    med, times, warm, last = bh.budget_seconds(lambda: calls.append(1) or len(calls), 5, 0.0)
    assert (len(times), warm, last, len(calls)) == (1, 0, 1, 1) and med == times[0]
    med, times, warm, last = bh.budget_seconds(lambda: calls.append(1) or len(calls), 3, 1e9)
    assert (len(times), warm, last) == (3, 1, 5) and med > 0


def _sig(x, digits=3):
    """x to `digits` significant figures, as the docs' tables print a time."""
    return float(f"{x:.{digits}g}")


def _window_rows(path):
    """{(mask, pass, N): (C++ band ms, torch band ms, speed-up)} of a window section's JSON,
    rounded as the docs print them (3 significant figures, 2 decimals)."""
    with open(path) as f:
        records = json.load(f)["records"]
    seconds = {(r["causal"], r["pass"], r["n"], r["impl"]): r for r in records
               if r["section"] == "window"}
    rows = {}
    for (causal, pas, n, impl), r in seconds.items():
        if impl == "cpp":
            torch_s = seconds[(causal, pas, n, "torch_band")]["seconds"]
            rows[("causal" if causal else "bidir", pas, n)] = [
                _sig(r["seconds"] * 1e3), _sig(torch_s * 1e3),
                float(bh.fmt_ratio(r["speedup_vs_torch_band"]))]
    return rows


def _check_window_table(anchor, main, *others):
    """The docs/performance.md table after `anchor` is the run in docs/data/`main` (C++ band
    ms, torch band ms and the speed-up of each mask, pass and N), its further columns the
    speed-ups of the runs in `others`: every row of the files is in the table, times to 3
    significant figures, speed-ups to 2 decimals, and no other row."""
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    data = os.path.join(root, "docs", "data")
    want = _window_rows(os.path.join(data, main))
    for name in others:
        other = _window_rows(os.path.join(data, name))
        assert set(other) == set(want)
        for key, row in other.items():
            want[key] = want[key] + [row[2]]
    with open(os.path.join(root, "docs", "performance.md")) as f:
        text = f.read()
    at = text.index(anchor)
    table = text[text.index("| mask | pass | N |", at):]
    table = table[:table.index("\n\n")].splitlines()[2:]
    rows = {}
    for line in table:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[(cells[0], cells[1], int(cells[2]))] = [float(c) for c in
                                                      cells[3:6 + len(others)]]
    assert rows == want


def test_the_zen3_window_table_quotes_its_json():
    """docs/performance.md's Zen 3 table of method='window' is the run in
    docs/data/python_bench_window_zen3.json, its last column the speed-ups of the other run
    (docs/data/python_bench_window_zen3_other_run.json)."""
    _check_window_table("`docs/data/python_bench_window_zen3.json`, the command above",
                        "python_bench_window_zen3.json",
                        "python_bench_window_zen3_other_run.json")


def test_the_grouped_window_table_quotes_its_json():
    """docs/performance.md's table of the band's groups is the run in
    docs/data/python_bench_window_zen3_grouped.json, its last two columns the speed-ups of
    the second run (..._grouped_other_run.json) and of the parent's (..._parent.json)."""
    _check_window_table("docs/data/python_bench_window_zen3_grouped.json`, then",
                        "python_bench_window_zen3_grouped.json",
                        "python_bench_window_zen3_grouped_other_run.json",
                        "python_bench_window_zen3_parent.json")


def test_the_bidirectional_hybrid_table_quotes_its_json():
    """docs/performance.md's table of the bidirectional hybrid (forward, backward recomputing,
    backward from the saved context) ends each cell with the run in
    docs/data/bench_hybrid_bidir_zen3.json: seconds to 3 significant figures, the ratios to
    bidirectional FAVOR's row and to the hybrid's forward to 2 decimals."""
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    with open(os.path.join(root, "docs", "data", "bench_hybrid_bidir_zen3.json")) as f:
        records = [r for r in json.load(f)
                   if r["method"] == "hybrid" and r["causal"] is False]
    want = {}
    for r in records:
        row = ("forward" if r["pass"] == "forward" else
               "backward from the saved context" if r["context"] else "backward, recomputing")
        want[row] = [_sig(r["seconds"]), round(r["ratio_to_favor"], 2),
                     round(r.get("ratio_to_forward", 1.0), 2)]
    with open(os.path.join(root, "docs", "performance.md")) as f:
        text = f.read()
    table = text[text.index("| row (bidirectional, N = 2048) |"):]
    table = table[:table.index("\n\n")].splitlines()[2:]
    rows = {}
    for line in table:
        cells = [c.strip() for c in line.strip("|").split("|")]
        last = lambda cell: float(cell.split("(")[0].split(",")[-1])  # noqa: E731
        rows[cells[0]] = [last(c) for c in cells[1:4]]
    assert rows == want
