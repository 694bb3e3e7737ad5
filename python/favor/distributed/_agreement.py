"""How favor.distributed keeps the ranks together when one of them fails before the C++ call.

The C++ call (favor._core.sequence_parallel_*) starts with a collective: every rank's error
message is gathered (allgather_text), then every rank raises the same favor.Error naming the
rank that broke a rule. A rank whose call fails before it reaches C++ (a wrong argument type,
a 0-d tensor, a conversion, a tensor modified in place before the backward) must still take
part in that collective, or the others wait in it forever: everything a wrapper does before
the call runs inside `agreed(exchange, f)`, which refuses any Exception with the other ranks
(favor._core.sequence_parallel_refuse). Every rank then raises the same favor.Error; on the
failing rank it is raised from the original exception (its __cause__), whose type the message
names when it is not a ValueError ("sequence-parallel attention: rank 1: TypeError: ...").
"""
from .. import _core


def check_exchange(exchange):
    """Raises favor.Error unless `exchange` is a favor.distributed.Exchange (without one this
    rank cannot join the others' agreement)."""
    if not isinstance(exchange, _core.Exchange):
        raise _core.Error(f"exchange: must be a favor.distributed.Exchange (MPIExchange, "
                          f"TorchExchange or a subclass), not {type(exchange).__name__}")


def refuse(exchange, error, vq=False):
    """Joins the agreement on errors of the call the other ranks are in with `error` (an
    Exception raised here before the call) and raises the favor.Error every rank raises, from
    `error`. vq: the message of the VQ calls."""
    message = str(error) if isinstance(error, ValueError) else f"{type(error).__name__}: {error}"
    try:
        _core.sequence_parallel_refuse(exchange, message, vq)
    except _core.Error as every_rank:
        raise every_rank from error


def agreed(exchange, f, vq=False):
    """f() (what a rank does before the C++ call); any Exception it raises is refused with the
    other ranks (refuse)."""
    try:
        return f()
    except Exception as e:  # noqa: BLE001  every error must reach the other ranks
        refuse(exchange, e, vq)


def flag(value, name):
    """`value` as a bool, converted as favor's bindings convert one (pybind11: None is False,
    objects whose type defines __bool__ give bool(value)); TypeError naming the argument for
    anything else (a str, a list)."""
    if value is None:
        return False
    if hasattr(type(value), "__bool__"):
        try:
            return bool(value)
        except Exception:  # noqa: BLE001  e.g. an array of several elements: named below
            pass
    raise TypeError(f"{name}: {value!r:.80} ({type(value).__name__}) is not a bool")
