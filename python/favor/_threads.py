"""favor's thread count, and whether the user chose it.

The rule (docs/python.md, "Threads"): favor.set_num_threads(n) or FAVOR_NUM_THREADS fixes the
count for every call; otherwise favor.torch calls use torch.get_num_threads(), the one knob a
torch user already sets (PyPI's torch sets it to the physical cores), so the two libraries
never run more threads than torch was told to and never fewer, and numpy-API calls use
favor's count (all cores, or what the last favor.torch call set). build_info() reports the count a call uses and why."""
import os
import sys

from . import _core

_user_set = "FAVOR_NUM_THREADS" in os.environ
_source = "FAVOR_NUM_THREADS" if _user_set else None


def set_num_threads(n):
    """Threads favor's kernels use from now on (n >= 1). After this call favor.torch no
    longer follows torch.get_num_threads()."""
    global _user_set, _source
    _core.set_num_threads(int(n))
    _user_set, _source = True, "favor.set_num_threads"


def user_set():
    return _user_set


def follow(n):
    """Use n threads unless the user chose a count (called by favor.torch's ops)."""
    if not _user_set and _core.num_threads() != n:
        _core.set_num_threads(n)


def effective():
    """(threads of the next numpy-API call, of the next favor.torch call or None when torch is
    not imported, why)."""
    n = _core.num_threads()
    if _user_set:
        return n, n, _source
    torch = sys.modules.get("torch")
    if torch is None:
        return n, None, "favor's count; favor.torch calls follow torch.get_num_threads()"
    return n, torch.get_num_threads(), "favor.torch calls follow torch.get_num_threads()"


def build_info():
    """favor._core.build_info() with the thread counts calls use: 'threads N' is the count of
    a numpy-API call; with torch imported, 'torch calls M' the count of a favor.torch call."""
    text = _core.build_info()
    numpy_threads, torch_threads, why = effective()
    head, sep, _ = text.rpartition("; threads ")
    if not sep:
        return text
    parts = [f"threads {numpy_threads}"]
    if torch_threads is not None:
        parts.append(f"torch calls {torch_threads}")
    return f"{head}; {', '.join(parts)} ({why})"
