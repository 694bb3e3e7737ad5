"""Docs that run: every ```python and ```sh block of README.md, docs/*.md and
examples/*/README.md runs as written and exits 0 (docs_blocks.py has the rules), and the
runner itself fails a broken block, a fence without a language and a skip without a reason."""
import os
import pathlib
import re
import time

import pytest

import docs_blocks as db

BLOCKS = [b for page in db.pages() for b in db.parse(page)]
RUNNABLE = [b for b in BLOCKS if b.runs]
# FAVOR_DOCS_SHARD=i/n: this run takes every n-th runnable block from the i-th (CTest runs the
# shards side by side: python/CMakeLists.txt); the rules below run in every shard.
if os.environ.get("FAVOR_DOCS_SHARD"):
    _i, _n = (int(x) for x in os.environ["FAVOR_DOCS_SHARD"].split("/"))
    RUNNABLE = RUNNABLE[_i::_n]


def test_every_fence_names_its_language():
    bare = [b.name for b in BLOCKS if not b.lang]
    assert not bare, f"fences without a language (```text for output): {bare}"


def test_commands_are_in_fenced_blocks():
    found = [hit for page in db.pages() for hit in db.indented_commands(page)]
    assert not found, f"commands in indented blocks, which the runner cannot see: {found}"


@pytest.fixture(scope="module")
def server():
    with db.ForkServer() as s:
        yield s


@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.name)
def test_block_runs(block, server):
    r = db.run(block, server=server)
    assert r.returncode == 0, (f"{block.name} exited {r.returncode}\n--- block\n{block.text}"
                               f"--- stdout\n{r.stdout[-4000:]}--- stderr\n{r.stderr[-4000:]}")


def test_skipped_blocks_say_why():
    skipped = [b for b in BLOCKS if b.lang in db.RUN and b.marker.startswith("skip")]
    for b in skipped:
        assert len(b.marker[5:].strip()) > 5, f"{b.name}: skip without a reason"
    # Skips are for installs, GPUs, MPI launchers and the suite itself: a handful, not the pages.
    assert len(skipped) < len([b for b in BLOCKS if b.runs]), [b.name for b in skipped]


def test_same_as_blocks_run_on_the_page_they_name():
    runs = {}
    for b in BLOCKS:
        if b.runnable:
            runs.setdefault(b.name.rsplit(":", 1)[0], set()).update(b.commands)
    for b in BLOCKS:
        if b.marker.startswith("same-as"):
            page = b.marker.split(":", 1)[1].strip()
            missing = [c for c in b.commands if c not in runs.get(page, set())]
            assert b.commands and not missing, f"{b.name}: not run on {page}: {missing}"


def _page(tmp_path, text):
    page = tmp_path / "page.md"
    page.write_text(text)
    return db.parse(page)


def test_a_broken_block_fails(tmp_path):
    ok, bad_py, bad_sh = _page(tmp_path, "```python\nimport favor\nprint(favor.__name__)\n```\n\n"
                                         "```python\nprint(q)\n```\n\n```sh\nfavor --no-such-flag\n```\n")
    assert db.run(ok).returncode == 0
    r = db.run(bad_py)
    assert r.returncode != 0 and "NameError" in r.stderr
    assert db.run(bad_sh).returncode != 0
    # and the runner's command line reports it
    assert db.main([str(tmp_path / "page.md")]) == 1


def test_a_pipeline_fails_on_its_first_command(tmp_path):
    (b,) = _page(tmp_path, "```sh\nfalse | cat\necho reached\n```\n")
    assert db.run(b).returncode != 0


def test_markers(tmp_path):
    blocks = _page(tmp_path, "<!-- docs-test: quick -->\n```sh\npython examples/x.py --out o \\\n"
                             "  --steps 3   # the study\nfavor --version\n```\n\n"
                             "<!-- docs-test: skip: needs a GPU -->\n```python\nimport cuda\n```\n\n"
                             "```\nbare\n```\n")
    quick, skip, bare = blocks
    assert quick.marker == "quick" and quick.runs
    assert db.with_quick(quick.text).split("\n")[:2] == [
        "python examples/x.py --out o    --steps 3 --quick  # the study", "favor --version"]
    assert db.with_quick("favor bench --sections io\nfavor attention --q Q.npy") == \
        "favor bench --sections io --quick\nfavor attention --q Q.npy"
    assert not skip.runs and skip.marker == "skip: needs a GPU"
    assert bare.lang == "" and not bare.runs
    (same,) = _page(tmp_path, "<!-- docs-test: same-as: docs/model.md -->\n```sh\n"
                              "python a.py --x 1 \\\n   --y 2   # why\n\n# note\nfavor demo\n```\n")
    assert not same.runs and same.commands == ["python a.py --x 1 --y 2", "favor demo"]
    checked, both = _page(tmp_path, "<!-- docs-test: checked-by: test_x.py -->\n```sh\n"
                                    "python a.py\n```\n\n<!-- docs-test: quick; checked-by: "
                                    "test_y.py -->\n```sh\npython b.py\n```\n")
    assert not checked.runs and checked.checked_by == "test_x.py" and not checked.quick
    assert not both.runs and both.checked_by == "test_y.py" and both.quick
    for wrong in ("skip", "skip:", "fast", "timeout: soon", "same-as: model", "checked-by: x",
                  "checked-by: test_x.py; quick"):
        with pytest.raises(ValueError, match="docs-test marker"):
            _page(tmp_path, f"<!-- docs-test: {wrong} -->\n```sh\ntrue\n```\n")
    with pytest.raises(ValueError, match="never closed"):
        _page(tmp_path, "```python\nprint(1)\n")


CHECKED_CALL = re.compile(r"run_block\(\s*\"([^\"]+)\",\s*\"([^\"]+)\"")


def test_checked_blocks_run_in_the_test_file_they_name():
    """A block marked checked-by is left out here only because its test file runs it: the
    file exists and calls run_block (examples_python.py) with this page and one of the
    block's commands, and every such call finds its block."""
    here = pathlib.Path(__file__).parent
    calls = {}
    for test_file in sorted(here.glob("test_*.py")):
        for page, command in CHECKED_CALL.findall(test_file.read_text()):
            block = db.checked(page, command, test_file.name)  # ValueError if not exactly so
            calls.setdefault(block.name, []).append(test_file.name)
    checked = [b for b in BLOCKS if b.checked_by]
    assert checked, "no checked-by block: the check above would pass on nothing"
    for b in checked:
        assert calls.get(b.name) == [b.checked_by], (
            f"{b.name}: marked checked-by {b.checked_by}, run by {calls.get(b.name, 'no test')}")


def test_blocks_run_as_a_pip_user_runs_them(tmp_path):
    (b,) = _page(tmp_path, "```sh\ncommand -v python favor\npython -c 'import favor'\n"
                           "favor --version\ntest -d examples/hf && test -d docs\n```\n")
    r = db.run(b)
    assert r.returncode == 0, r.stderr
    assert ".docs-test-bin/python" in r.stdout and ".docs-test-bin/favor" in r.stdout


def test_fork_server_runs_python_as_python_does(tmp_path, server):
    """A block's `python` through the fork server: argv, sys.path[0], __main__, exit codes,
    an uncaught exception, -m, -c, atexit, a child process, multiprocessing's spawn (a
    relative script path) and the exit's wait for threads (a thread pool's idle worker, a
    running thread) as the interpreter gives them;
    torch already imported (the fork); a changed environment gets a fresh interpreter."""
    (b,) = _page(tmp_path, r"""```sh
cat > s.py <<'PY'
import os, sys
print("script", __name__, sys.argv, sys.path[0] == os.path.dirname(os.path.realpath(__file__)))
print("preloaded", "torch" in sys.modules)
sys.exit(int(sys.argv[1]))
PY
python s.py 0 x
python s.py 3 x || echo "status $?"
echo 'raise KeyError("boom")' > e.py
python e.py 2> err.txt || echo "exception status $?"
grep -c "KeyError: 'boom'" err.txt
python -c 'import sys; print("code", sys.argv, repr(sys.path[0]), __name__)' a b
python -m json.tool <<< '{"a": 1}' | tr -d ' \n'; echo
echo "import atexit; atexit.register(lambda: print('atexit ran'))" > a.py; python a.py
python -c 'import subprocess, sys; print(subprocess.run([sys.executable, "-c", "print(7)"], capture_output=True, text=True).stdout.strip())'
FAVOR_FORKSERVER_TEST=1 python -c 'import sys; print("changed env: preloaded", "torch" in sys.modules)'
python -u -c 'import sys; print("option: preloaded", "torch" in sys.modules)'
cat > mp.py <<'PY'
import multiprocessing as mp
def double(x):
    return 2 * x
if __name__ == "__main__":
    with mp.get_context("spawn").Pool(1) as pool:
        print("spawn", pool.map(double, [1, 2]))
PY
python mp.py
python -c 'import concurrent.futures as f; print("pool", f.ThreadPoolExecutor(1).submit(int, 3).result())'
python -c 'import threading, time; threading.Thread(target=lambda: (time.sleep(0.5), print("waited"))).start()'
```
""")
    r = db.run(b, server=server)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n") == [
        "script __main__ ['s.py', '0', 'x'] True", "preloaded True",
        "script __main__ ['s.py', '3', 'x'] True", "preloaded True", "status 3",
        "exception status 1", "1",
        "code ['-c', 'a', 'b'] '' __main__",
        '{"a":1}', "atexit ran", "7",
        "changed env: preloaded False", "option: preloaded False", "spawn [2, 4]",
        "pool 3", "waited", ""]


def test_fork_server_child_dies_with_its_block(tmp_path, server):
    """A block's timeout kills the server's child that runs its python, not only the shell."""
    (b,) = _page(tmp_path, "```sh\npython -c 'import os, sys, time; "
                           "print(os.getpid(), \"torch\" in sys.modules, flush=True); "
                           "time.sleep(120)'\n```\n")
    with pytest.raises(db.subprocess.TimeoutExpired) as e:
        db.run(b, timeout=4, server=server)
    pid, forked = e.value.stdout.split()
    assert forked == "True"  # it ran in the server's child
    deadline = time.time() + 10
    while os.path.exists(f"/proc/{pid}") and time.time() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid}"), "the timed-out block's python still runs"
