"""`python SCRIPT ARGS...` for the tests that run the example scripts, forked from one
interpreter that has already imported torch, transformers and favor: the docs runner's fork
server (docs_forkserver.py, docs_blocks.ForkServer), one per pytest process, started on the
first run. Each run is a child of the freshly imported server, so it starts as a fresh
interpreter would, without paying Python's, torch's and transformers' start-up again (~3-8 s
of CPU per script on 2 cores; docs/reliability.md, "Docs that run").

The script sees the server's environment (the test process's, with PYTHONPATH made absolute,
HF_HUB_OFFLINE=1, MPLBACKEND=Agg: docs_blocks.environment) and the working directory given;
any other environment (an `env` argument that changes a variable) runs a real interpreter,
as the fork server's client does for every run it cannot fork.
"""
import atexit
import subprocess

import docs_blocks

_server = None


def _started():
    global _server
    if _server is None:
        _server = docs_blocks.ForkServer()
        atexit.register(_server.close)
    return _server


def run(argv, cwd=None, env=None, timeout=300):
    """subprocess.run of `python *argv` (output captured as text): forked from the server, or
    a fresh interpreter when `env` changes a variable of the server's environment."""
    server = _started()
    run_env = dict(server.env)
    run_env.update(env or {})
    return subprocess.run(server.client() + list(argv), cwd=cwd, env=run_env,
                          capture_output=True, text=True, timeout=timeout)
