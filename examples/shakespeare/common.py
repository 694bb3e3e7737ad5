"""What the shakespeare scripts share: the data file, torch's thread count, and the sizes of
--quick (a smoke test of a command line as the docs write it, in seconds: docs/reliability.md,
"Docs that run"; effort is cut whatever was asked, as `favor accuracy --quick` does)."""
import os

import torch

from favor.models.conversion import calibration_windows

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data", "tinyshakespeare.txt")

# --quick: at most 2 training steps of batch 4, 4 validation windows, 4 calibration windows
# (instead of 16) and 10 Adam steps per learned-map fit (instead of 300)
QUICK = dict(steps=2, batch=4, windows=4, calibration=4, fit_steps=10)


def setup(threads, quick=False):
    """torch's threads: `threads` when given, else 1 under --quick (on a shared 2-core machine
    a second thread waiting for a busy core stalls every small op: streamed generation ran
    250x slower beside a busy process), else torch's own default."""
    if threads or quick:
        torch.set_num_threads(threads or 1)


def add_quick(parser, what):
    parser.add_argument("--quick", action="store_true",
                        help=f"a smoke test of the command line, in seconds: {what}")


def calibration(data, context, seed, quick):
    """The calibration windows of a conversion (16 training windows; --quick: 4)."""
    return calibration_windows(data, context, seed,
                               count=QUICK["calibration"] if quick else 16)


def fit_options(quick):
    """convert_method's keywords: fewer Adam steps per learned-map fit under --quick."""
    return dict(fit_steps=QUICK["fit_steps"]) if quick else {}
