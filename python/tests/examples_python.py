"""The interpreter and environment the example scripts run with in the tests.

Under CTest (python/CMakeLists.txt) the HF examples' tests run their scripts with the clean
venv that python_pip_install made from the repaired wheel and `pip install '<wheel>[hf]'`
(FAVOR_EXAMPLES_PYTHON_FILE names a file holding its interpreter): that venv has what a user
installs and nothing else, and imports the installed favor (PYTHONPATH dropped). Without it
(pytest run by hand, or FAVOR_SKIP_PIP_TEST=1) they use this interpreter and environment.
"""
import os
import sys


def examples_python():
    """(interpreter, environment) for a subprocess that runs an example script."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    marker = os.environ.get("FAVOR_EXAMPLES_PYTHON_FILE", "")
    if marker and os.path.exists(marker):
        with open(marker) as f:
            python = f.read().strip()
        env.pop("PYTHONPATH", None)
        env.pop("FAVOR_EXAMPLES_PYTHON_FILE", None)
        return python, env
    return sys.executable, env
