"""favor's thread count, and whether the user chose it (favor.torch follows torch's
thread count unless the user did, or FAVOR_NUM_THREADS is set)."""
import os

from . import _core

_user_set = "FAVOR_NUM_THREADS" in os.environ


def set_num_threads(n):
    """Threads favor's kernels use from now on (n >= 1). After this call favor.torch no
    longer follows torch.get_num_threads()."""
    global _user_set
    _core.set_num_threads(int(n))
    _user_set = True


def user_set():
    return _user_set


def follow(n):
    """Use n threads unless the user chose a count (called by favor.torch)."""
    if not _user_set and _core.num_threads() != n:
        _core.set_num_threads(n)
