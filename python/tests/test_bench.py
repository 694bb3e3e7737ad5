"""python3 -m favor.bench --quick --json: the document's structure and that every figure is
finite (and positive, except the overheads, which are differences of two timings). No
assertion on the timings themselves: the machine may be busy."""
import json
import math
import os
import subprocess
import sys

import pytest

IMPLS = {"favor", "torch_favor_plus", "softmax"}
PASSES = {"fwd", "fwd+bwd"}
DIFFERENCES = {"numpy_overhead_us", "torch_overhead_us"}


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
            if key not in DIFFERENCES:
                assert x > 0, (key, r)
