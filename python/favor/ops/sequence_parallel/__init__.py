"""favor::sequence_parallel_attention(_backward) and favor::sequence_parallel_vq_attention
(_backward): this rank's slice of FAVOR and Transformer-VQ attention whose sequence is split
over ranks, as torch custom ops. The collectives run inside the ops, in C++
(favor._core.sequence_parallel_*), over the favor.distributed.Exchange an op names by its
handle (exchanges.py). Their oracles are the single-process ops (ops/attention, ops/vq) on
the whole sequence; the layers are favor.distributed.attention and vq_attention."""
from .attention import sequence_parallel_attention_op
from .exchanges import exchange_handle
from .vq import sequence_parallel_vq_attention_op

__all__ = ["exchange_handle", "sequence_parallel_attention_op",
           "sequence_parallel_vq_attention_op"]
