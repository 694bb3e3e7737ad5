"""The markdown block runner: every ```python and ```sh block of README.md, docs/*.md and
examples/*/README.md runs as written, as a pip user runs it (docs/reliability.md, "Docs that
run").

Rules of the pages (checked here, so a page that breaks one fails its test):
- Every fence names its language. ```python and ```sh (or ```bash) blocks run; every other
  language (text for output and formulas, cpp, cmake, json, ...) is shown only.
- A block runs on its own, in a fresh temporary directory holding copies of the checkout's
  examples/ and docs/ (what a block writes there is thrown away) and a link to scripts/, with
  `python` and `favor` first on PATH: the interpreter with favor importable and favor's
  command-line tool. HF_HUB_OFFLINE=1: nothing reaches the Hugging Face hub. sh blocks run
  under `bash -e -o pipefail`. As root (CI), Open MPI's mpirun is allowed to run.
- The line just above a fence may hold one marker:
    <!-- docs-test: quick -->          every command line of the block that runs a Python
                                       script or module (python X.py, python -m M) or favor
                                       (favor bench, accuracy, fit) gets --quick appended:
                                       long runs, shortened
    <!-- docs-test: skip: REASON -->   not run (installs, a GPU, mpirun, the suite itself);
                                       the reason is required and printed
    <!-- docs-test: timeout: SECONDS --> a longer limit than the default 300 s
    <!-- docs-test: same-as: PAGE -->  not run again: every command line of the block is a
                                       command line of a block of PAGE that runs (a page
                                       repeating another's commands; test_docs.py checks it)
    <!-- docs-test: checked-by: FILE --> run by the test file python/tests/FILE instead of
                                       test_docs.py, which asserts on what the block prints
                                       and writes (checked(): test_docs.py checks that FILE
                                       takes the block); `quick; checked-by: FILE` with --quick

    python python/tests/docs_blocks.py [FILES...]     runs them by hand (default: every page)
"""
import dataclasses
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUN = {"python": "python", "sh": "sh", "bash": "sh"}
FENCE = re.compile(r"^(\s*)```(.*)$")
MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(.*?)\s*-->\s*$")
DEFAULT_TIMEOUT = 300
FORKSERVER = pathlib.Path(__file__).resolve().with_name("docs_forkserver.py")


@dataclasses.dataclass
class Block:
    path: pathlib.Path
    line: int            # 1-based line of the opening fence
    lang: str            # the fence's language; "" when it names none
    text: str
    marker: str = ""     # quick, skip: reason, timeout: seconds, same-as: page,
    #                      [quick; ]checked-by: test file, or ""

    @property
    def name(self):
        try:
            rel = self.path.resolve().relative_to(ROOT)
        except ValueError:
            rel = self.path.name
        return f"{rel}:{self.line}"

    @property
    def quick(self):
        return self.marker == "quick" or self.marker.startswith("quick;")

    @property
    def checked_by(self):
        """The test file that runs this block (marker checked-by), else None."""
        m = re.search(r"(?:^|;\s*)checked-by:\s*(\S+)$", self.marker)
        return m.group(1) if m else None

    @property
    def runnable(self):
        """Whether some test runs it: test_docs.py, or the file its checked-by marker names."""
        return self.lang in RUN and not self.marker.startswith(("skip", "same-as"))

    @property
    def runs(self):
        """Whether test_docs.py runs it (a checked-by block runs in its test file)."""
        return self.runnable and self.checked_by is None

    @property
    def commands(self):
        """The block's command lines: continuations joined, comments and blank lines dropped,
        spaces collapsed (what same-as compares)."""
        out = []
        for line in logical_lines(self.text):
            line = re.split(r"(^|\s)#\s", line)[0] if not line.lstrip().startswith("#") else ""
            line = " ".join(line.split())
            if line:
                out.append(line)
        return out


def pages(root=ROOT):
    """The markdown pages whose blocks run: README.md, docs/*.md, examples/*/README.md."""
    return ([root / "README.md"] + sorted((root / "docs").glob("*.md"))
            + sorted((root / "examples").glob("*/README.md")))


def parse(path):
    """Every fenced block of one page, with its marker. ValueError for an unclosed fence, an
    unknown marker, or a skip without a reason."""
    path = pathlib.Path(path)
    lines = path.read_text().split("\n")
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang = m.group(1), m.group(2).strip()
        j = i + 1
        while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
            j += 1
        if j == len(lines):
            raise ValueError(f"{path}:{i + 1}: the fence opened here is never closed")
        body = [ln[len(indent):] if ln.startswith(indent) else ln.lstrip() for ln in lines[i + 1:j]]
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        marker = ""
        if k >= 0 and MARKER.match(lines[k]):
            marker = MARKER.match(lines[k]).group(1)
            if not re.fullmatch(r"quick|skip:\s*\S.*|timeout:\s*\d+|same-as:\s*\S+\.md|"
                                r"(quick;\s*)?checked-by:\s*test_\w+\.py", marker):
                raise ValueError(f"{path}:{k + 1}: docs-test marker {marker!r}: use quick, "
                                 "skip: REASON, timeout: SECONDS, same-as: PAGE or "
                                 "[quick; ]checked-by: TEST_FILE")
        blocks.append(Block(path, i + 1, lang.split()[0] if lang else "", "\n".join(body) + "\n",
                            marker))
        i = j + 1
    return blocks


COMMAND = re.compile(r"^(favor|python3?|make|mpirun|torchrun|pip|scripts/|build/|examples/|"
                     r"PYTHONPATH=|HF_HUB_OFFLINE=|\.venv/|[A-Z_]+=)")


def indented_commands(path):
    """Lines that open an indented (unfenced) code block holding a command: such a block would
    escape the runner. (A block follows a blank line and no list item; formulas may stay
    indented.)"""
    lines = pathlib.Path(path).read_text().split("\n")
    found, fenced = [], False
    for i, line in enumerate(lines):
        if re.match(r"^\s*```", line):
            fenced = not fenced
            continue
        if fenced or not line.startswith("    ") or not line.strip() or i == 0 or lines[i - 1].strip():
            continue
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        prev = lines[k] if k >= 0 else ""
        if re.match(r"^\s*([-*+]|\d+\.)\s", prev) or prev.startswith("  "):
            continue
        if COMMAND.match(line.strip()):
            found.append(f"{path}:{i + 1}: {line.strip()[:80]}")
    return found


def logical_lines(script):
    """The lines of a shell script with backslash continuations joined (one line each)."""
    out, pending = [], ""
    for line in script.split("\n"):
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    return out


def with_quick(script):
    """The sh block with --quick after every logical command line that runs `python X.py`,
    `python -m M` or `favor bench|accuracy|fit` (a trailing # comment kept after it)."""
    out = []
    for line in logical_lines(script):
        code, hash_, comment = line, "", ""
        m = re.search(r"\s#\s", line)
        if m:
            code, hash_, comment = line[:m.start()], "  # ", line[m.end():]
        if re.search(r"(^|[\s;&|(])(python3?\s+(-m\s+\S+|\S+\.py)|favor\s+(bench|accuracy|fit)\b)", code):
            code = code.rstrip() + " --quick"
        out.append(code + (hash_ + comment if hash_ else ""))
    return "\n".join(out)


def environment(workdir, server=None, python=None, base=None):
    """PATH with `python` and `favor` first, PYTHONPATH for the developer tree's build, the hub
    off. FAVOR_DOCS_PYTHON / FAVOR_CLI name the interpreter and the CLI (CTest sets the CLI;
    the interpreter is by default this one).
    With a ForkServer, `python` is its client (docs_forkserver.py). `python` and `base` (an
    environment in place of os.environ, taken as it is: no build tree added to its
    PYTHONPATH) run the block with another interpreter, e.g. a venv where favor is installed
    (examples_python.py)."""
    env = dict(os.environ if base is None else base, HF_HUB_OFFLINE="1", MPLBACKEND="Agg")
    if "PYTHONPYCACHEPREFIX" not in env:  # else bytecode goes there, out of the trees
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    if os.geteuid() == 0:  # CI runs as root, which Open MPI's mpirun refuses unless told
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    python = docs_python(python)
    cli = os.environ.get("FAVOR_CLI", str(ROOT / "build" / "tools" / "favor"))
    shims = pathlib.Path(workdir) / ".docs-test-bin"
    shims.mkdir()
    run_python = " ".join(shlex.quote(a) for a in
                          (server.client(python) if server is not None else [python]))
    for name, command in (("python", run_python), ("python3", run_python),
                          ("favor", shlex.quote(cli))):
        shim = shims / name
        shim.write_text(f"#!/bin/sh\nexec {command} \"$@\"\n")
        shim.chmod(0o755)
    # then the interpreter's own scripts (torchrun, accelerate), as in an activated venv
    scripts = os.path.dirname(os.path.abspath(python))
    env["PATH"] = os.pathsep.join([str(shims), scripts, env.get("PATH", "")])
    build_python = ROOT / "build" / "python"
    if env.get("PYTHONPATH"):  # the block runs elsewhere: absolute entries
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in
                                            env["PYTHONPATH"].split(os.pathsep) if p)
    elif build_python.is_dir() and base is None:
        env["PYTHONPATH"] = str(build_python)
    return env


def docs_python(python=None):
    """The interpreter the blocks run: `python`, else FAVOR_DOCS_PYTHON, else this one."""
    return python or os.environ.get("FAVOR_DOCS_PYTHON", sys.executable)


class ForkServer:
    """docs_forkserver.py's server for the blocks' `python` commands: started on entry (it
    imports torch, transformers and favor once), stopped on exit."""

    def __init__(self, python=None, base=None):
        """`python` and `base`: environment()'s (the blocks run with the same)."""
        self._dir = tempfile.TemporaryDirectory(prefix="docs-forkserver-")
        self.socket = os.path.join(self._dir.name, "socket")
        # the server's environment: a client's must match it
        self.env = environment(self._dir.name, python=python, base=base)
        self.python = docs_python(python)
        self._proc = subprocess.Popen(
            [self.python, str(FORKSERVER), "serve", self.socket], env=self.env,
            stdout=subprocess.PIPE, text=True, start_new_session=True)
        line = self._proc.stdout.readline()
        if line.strip() != "ready":
            self.close()
            raise RuntimeError(f"the docs fork server did not start (it said {line!r})")

    def client(self, python=None):
        """The command (a list) that runs `python ARGS...` through this server: its client,
        which execs `python` (default: the server's interpreter) for what it cannot fork.
        -S -E: the client starts in ~20 ms, stdlib only."""
        return [python or self.python, "-S", "-E", str(FORKSERVER), self.socket]

    def close(self):
        if self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait()
        self._proc.stdout.close()
        self._dir.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def run(block, timeout=None, server=None, workdir=None, python=None, env=None):
    """Runs one block in a fresh directory; returns the CompletedProcess (output captured).
    With a ForkServer, its `python` commands are forked from it. `workdir`: an empty
    directory to run in, which the caller keeps (to read what the block wrote), else a
    temporary one; `python` and `env`: environment()'s `python` and `base`."""
    if timeout is None:
        m = re.fullmatch(r"timeout:\s*(\d+)", block.marker)
        timeout = int(m.group(1)) if m else DEFAULT_TIMEOUT
    if workdir is not None:
        return _run_in(block, timeout, server, str(workdir), python, env)
    with tempfile.TemporaryDirectory(prefix="docs-test-") as work:
        return _run_in(block, timeout, server, work, python, env)


def checked(page, command, test_file):
    """The block of `page` (relative to the checkout) with a command line containing
    `command`, which names `test_file` (a path; its name is compared) in its checked-by
    marker: the block a test runs and asserts on. ValueError when there is not exactly one
    such block, or its marker names another file."""
    found = [b for b in parse(ROOT / page) if b.lang in RUN
             and any(command in c for c in b.commands)]
    if len(found) != 1:
        raise ValueError(f"{page}: {len(found)} python or sh blocks run {command!r}, not one")
    name = os.path.basename(test_file)
    if found[0].checked_by != name:
        raise ValueError(f"{found[0].name}: its marker is {found[0].marker!r}, not "
                         f"'checked-by: {name}'")
    return found[0]


def _run_in(block, timeout, server, work, python, base):
    # Copies of docs/ and examples/ (11 MB): a block that writes docs/data/... or a
    # checkpoint under examples/ must not change the checkout.
    for name in ("docs", "examples"):
        shutil.copytree(ROOT / name, os.path.join(work, name), symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "runs"))
    os.symlink(ROOT / "scripts", os.path.join(work, "scripts"))
    env = environment(work, server, python, base)
    if RUN[block.lang] == "python":
        script = os.path.join(work, ".docs-test-block.py")
        pathlib.Path(script).write_text(block.text)
        cmd = ["python", script]
    else:
        script = with_quick(block.text) if block.quick else block.text
        cmd = ["bash", "-e", "-o", "pipefail", "-c", script]
    # Its own session: a timeout kills everything the block started (a fork server's
    # child goes with its client), not only the shell.
    proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, out, err) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def main(argv):
    paths = [pathlib.Path(p) for p in argv] or pages()
    with ForkServer() as server:
        failed = _main(paths, server)
    return 1 if failed else 0


def _main(paths, server):
    failed = 0
    for path in paths:
        for block in parse(path):
            if not block.lang:
                print(f"FAIL {block.name}: the fence names no language")
                failed += 1
            elif block.lang in RUN and block.marker.startswith("skip"):
                print(f"skip {block.name}: {block.marker[5:].strip()}")
            elif block.lang in RUN and block.marker.startswith("same-as"):
                print(f"same {block.name}: its commands run on {block.marker[8:].strip()}")
            elif block.runnable:
                r = run(block, server=server)
                print(f"{'ok  ' if r.returncode == 0 else 'FAIL'} {block.name}")
                if r.returncode:
                    failed += 1
                    print(r.stdout[-3000:] + r.stderr[-3000:])
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
