"""The favor package has no import cycles, and every module imports on its own.

The graph is read from the source (python/favor/**/*.py) with ast: every import statement
in a module, at module level or inside a function (a deferred import that closes a cycle is
a cycle all the same: it only moves the failure to the first call), relative imports
resolved. `from pkg import name` is an edge to pkg.name when that is a module of the
package, else to pkg. A module's parent packages are not edges (Python runs them first
whatever the module imports). The favor._core extension has no source and no edges.
"""
import ast
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "favor"
EXTENSIONS = ("favor._core",)  # compiled: modules of the package without edges


def module_names(root=ROOT):
    """{dotted module name: path} of every .py file of the package."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = ("favor",) + path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _resolve(node, module, is_package):
    """The absolute module an ImportFrom names (relative levels resolved)."""
    if node.level == 0:
        return node.module
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module, path, modules):
    """The favor modules that `module` (at `path`) imports, anywhere in the file."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(node, module, is_package)
            targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source
                       for a in node.names]
        else:
            continue
        found.update(t for t in targets if t in modules and t != module)
    return found


def import_graph(root=ROOT):
    modules = module_names(root)
    graph = {name: set() for name in EXTENSIONS}
    graph.update((name, imports_of(name, path, set(modules) | set(EXTENSIONS)))
                 for name, path in modules.items())
    return graph


def cycles(graph):
    """Every strongly connected component with more than one module (Tarjan), as sorted
    lists, each followed by one cycle through it for the message."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def one_cycle(graph, component):
    """A path start -> ... -> start inside the component, for the failure message."""
    members, start = set(component), component[0]
    path, seen = [start], {start}
    while True:
        nxt = sorted(w for w in graph[path[-1]] if w in members)
        back = [w for w in nxt if w == start]
        if back and len(path) > 1:
            return path + [start]
        step = next((w for w in nxt if w not in seen), None)
        if step is None:  # only edges back into the path: close at the first one
            w = nxt[0]
            return path[path.index(w):] + [w]
        path.append(step)
        seen.add(step)


def test_graph_sees_the_package():
    graph = import_graph()
    # A sanity check of the parser: known edges of the package.
    assert "favor.api" in graph["favor"]
    assert "favor.vq" in graph["favor.api"]  # a deferred import (inside a function)


def test_finds_a_cycle(tmp_path):
    # The check itself: a package with a deferred import closing a cycle.
    pkg = tmp_path / "favor"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "a.py").write_text("from . import b\n\ndef f():\n    return b\n")
    (pkg / "b.py").write_text("def g():\n    from .a import f\n    return f\n")
    graph = import_graph(pkg)
    assert cycles(graph) == [["favor.a", "favor.b"]]


def test_no_import_cycles():
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles in python/favor:\n" + "\n".join(
        f"  {', '.join(c)}\n    e.g. " + " -> ".join(one_cycle(graph, c)) for c in found)


NEEDS_TORCH = ("favor.torch", "favor.bench", "favor.models", "favor.distributed.function",
               "favor.distributed.vq_function", "favor.distributed.torch_exchange")

# One interpreter imports the third-party packages favor uses (no favor module), then forks a
# child per favor module that imports just that module: each child starts with no favor
# module loaded, as a fresh interpreter would, without paying torch's, triton's or
# transformers' import per module (~2 s each; 80 modules).
_FORKER = r"""
import importlib, json, os, sys, traceback
for lib in ("numpy", "torch", "mpi4py", "triton", "triton.language", "transformers",
            "transformers.cache_utils", "transformers.masking_utils", "transformers.modeling_utils"):
    try:
        importlib.import_module(lib)
    except ImportError:
        pass
assert not [m for m in sys.modules if m == "favor" or m.startswith("favor.")]
results = {}
for module in sys.argv[1:]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            importlib.import_module(module)
            code, text = 0, ""
        except BaseException:
            code, text = 1, traceback.format_exc()
        os.write(w, text.encode())
        os._exit(code)
    os.close(w)
    chunks = []
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    results[module] = [os.waitstatus_to_exitcode(status), b"".join(chunks).decode()]
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def imported_alone():
    """{module: [exit code, traceback]} of `import <module>` in a child with no favor module
    imported before it."""
    modules = sorted(module_names())
    done = subprocess.run([sys.executable, "-c", _FORKER, *modules], capture_output=True,
                          text=True, timeout=600, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module", sorted(module_names()))
def test_module_imports_alone(module, imported_alone):
    """`import <module>` with nothing of favor imported first."""
    if module.startswith(NEEDS_TORCH):
        pytest.importorskip("torch")
    if module == "favor.distributed.mpi_exchange":
        pytest.importorskip("mpi4py")
    code, trace = imported_alone[module]
    assert code == 0, f"import {module}:\n{trace}"
