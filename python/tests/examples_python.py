"""The interpreter and environment the example scripts run with in the tests.

Under CTest (python/CMakeLists.txt) the HF examples' tests run their scripts with the clean
venv that python_pip_install made from the repaired wheel and `pip install '<wheel>[hf]'`
(FAVOR_EXAMPLES_PYTHON_FILE names a file holding its interpreter): that venv has what a user
installs and nothing else, and imports the installed favor (PYTHONPATH dropped). Without it
(pytest run by hand, or FAVOR_SKIP_PIP_TEST=1) they use this interpreter and environment.
That venv's bytecode is written beside it (PYTHONPYCACHEPREFIX: the install made none), so
only the first start compiles torch's and transformers' modules.

run_block runs a docs block that names its test file (`checked-by`, docs_blocks.py) with
that interpreter: the docs' own commands, checked by the test.
"""
import os
import sys

import docs_blocks as db


def blocks_python():
    """(interpreter, environment) for run_block: the wheel venv's where the marker file names
    it, else this interpreter; on one thread."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    marker = os.environ.get("FAVOR_EXAMPLES_PYTHON_FILE", "")
    if marker and os.path.exists(marker):
        with open(marker) as f:
            python = f.read().strip()
        env.pop("PYTHONPATH", None)
        env.pop("FAVOR_EXAMPLES_PYTHON_FILE", None)
        # pip installed torch and transformers without bytecode (--no-compile): each start
        # would compile what it imports (~10 s of CPU); the first writes it beside the venv.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = os.path.join(
            os.path.dirname(os.path.dirname(os.path.dirname(python))), "pycache")
        return python, env
    return sys.executable, env


def run_block(page, command, test_file, workdir, server=None):
    """The docs block of `page` that runs `command` (its marker names `test_file`), run as
    test_docs.py runs blocks but with blocks_python()'s interpreter (under CTest: the venv
    of `pip install '<wheel>[hf]'`, where favor is installed) in `workdir`; returns its
    stdout. `server`: a docs_blocks.ForkServer(*blocks_python()) for its `python` commands."""
    block = db.checked(page, command, test_file)
    python, env = blocks_python()
    r = db.run(block, workdir=workdir, server=server, python=python, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout
