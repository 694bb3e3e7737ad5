"""The exchanges favor's sequence-parallel ops run their collectives over, named by an int
handle: a custom op's arguments are tensors and plain values, and an Exchange (a Python
object: TorchExchange, MPIExchange or a subclass) is neither. The caller keeps the exchange
alive through the call (and autograd keeps it until the backward); the table holds it
weakly, so an exchange made for one call goes when its last user does."""
import weakref

from ... import _core

_live = weakref.WeakValueDictionary()
_strong = {}  # exchanges that take no weak reference (none of favor's own)


def exchange_handle(exchange):
    """The int that names `exchange` (a favor._core.Exchange) in an op's arguments."""
    key = id(exchange)
    try:
        _live[key] = exchange
    except TypeError:
        _strong[key] = exchange
    return key


def exchange_of(handle):
    """The exchange named by `handle`."""
    exchange = _live.get(handle) or _strong.get(handle)
    if exchange is None:
        raise _core.Error(f"exchange: handle {handle} names no live favor.distributed.Exchange; "
                          "take a handle with exchange_handle and keep the exchange alive")
    return exchange


def record(exchange, name, stats):
    """Keeps the last call's SequenceParallelStats on the exchange (forward_stats,
    backward_stats) when it takes attributes."""
    try:
        setattr(exchange, name, stats)
    except AttributeError:
        pass
