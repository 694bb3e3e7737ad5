"""The two state collectives of sequence-parallel attention written with point-to-point
messages only (TorchExchange sends them with torch.distributed's isend / irecv).

Both take `sendrecv(dst, src, payload)`: send the uint8 array `payload` to rank `dst` (None:
send nothing) and return the array received from rank `src` (None: receive nothing, return
None), concurrently, so that two ranks may exchange in one step. Records combine with
favor._core.combine_states(earlier, later, record_bytes) (later := earlier (+) later), which
is associative but not commutative: every combination below keeps the rank order.

Steps (one message of one block each way per step, P ranks):
- allreduce_states: recursive doubling, log2 P steps when P is a power of two; otherwise
  the first 2 (P - P') ranks (P' the largest power of two below P) fold in pairs first and
  get the result back last: floor(log2 P) + 2 steps. Both partners of a step combine the
  same two blocks in the same order, so every rank ends with the same bits.
- exscan_states: Hillis-Steele, ceil(log2 P) steps: at step d = 1, 2, 4, ... position v
  sends its partial of positions v-d+1 .. v to v + d and receives that of v - d.
"""
from .. import _core


def allreduce_states(block, rank, size, sendrecv):
    """block := the combination of every rank's block in rank order, on every rank."""
    data = block.bytes
    rb = block.record_bytes
    mine = data.copy()
    p2 = 1 << (size.bit_length() - 1)  # the largest power of two <= size
    extra = size - p2
    if rank < 2 * extra:  # ranks 2i and 2i + 1 fold into 2i, which takes part below
        if rank % 2 == 1:
            sendrecv(rank - 1, None, mine)
            data[:] = sendrecv(None, rank - 1, mine)
            return
        later = sendrecv(None, rank + 1, mine)
        _core.combine_states(mine, later, rb)
        mine = later
        v = rank // 2
    else:
        v = rank - extra
    real = lambda u: 2 * u if u < extra else u + extra  # virtual rank -> rank
    d = 1
    while d < p2:
        partner = v ^ d
        other = sendrecv(real(partner), real(partner), mine)
        if partner < v:
            _core.combine_states(other, mine, rb)
        else:
            _core.combine_states(mine, other, rb)
            mine = other
        d <<= 1
    if rank < 2 * extra:
        sendrecv(rank + 1, None, mine)
    data[:] = mine


def exscan_states(block, reverse, rank, size, sendrecv):
    """block := the combination of ranks 0 .. rank-1 in order (reverse: of ranks size-1 ..
    rank+1, the higher rank earlier); empty records on rank 0 (reverse: size-1)."""
    data = block.bytes
    rb = block.record_bytes
    v = size - 1 - rank if reverse else rank  # the position in scan order
    real = lambda u: size - 1 - u if reverse else u
    total = data.copy()  # covers positions v-d+1 .. v
    prefix = None  # covers v-d+1 .. v-1 (None: nothing yet)
    d = 1
    while d < size:
        dst = real(v + d) if v + d < size else None
        src = real(v - d) if v - d >= 0 else None
        got = sendrecv(dst, src, total)  # covers v-2d+1 .. v-d: earlier than both
        if got is not None:
            if prefix is None:
                prefix = got.copy()
            else:
                _core.combine_states(got, prefix, rb)
            if 2 * d < size:  # the last step's total is not needed
                _core.combine_states(got, total, rb)
        d <<= 1
    if prefix is None:
        block.clear()
    else:
        data[:] = prefix
