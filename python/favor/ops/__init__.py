"""favor's torch ops, one folder per op (fla's ops/<op>/ layout): op.py registers the op with
torch.library (namespace favor::, a fake implementation for tracing, its autograd), naive.py
is its oracle in plain torch operations.

    favor::projection                        ops/projection   the drawn W [m, D]
    favor::attention, ::attention_backward   ops/attention    FAVOR, every kernel and map
    favor::exact_attention(_backward)        ops/exact        exact softmax attention
    favor::vq_attention(_backward)           ops/vq           Transformer-VQ
    favor::decode_step                       ops/decoder      one streaming decoder step
    favor::hybrid_decode_step                ops/hybrid       hybrid attention's step
    favor::vq_assign                         ops/codebook     nearest code of every key
    favor::codebook_initialise               ops/codebook     k-means on the first batch
    favor::codebook_ema_update               ops/codebook     EMA step, dead-code reset
    favor::codebook_track_usage              ops/codebook     'grad' learning: usage, reset
    favor::sequence_parallel_attention(_backward), favor::sequence_parallel_vq_attention
    (_backward)                              ops/sequence_parallel  a rank's slice

The one device switch is ops/_tensors.py's backend(): CPU tensors go to the C++ kernels (the
custom ops above), CUDA tensors to the fused Triton kernels (ops/attention/triton/; the torch
path when triton is missing), any other device to the torch path (plain torch operations:
ops/<op>/generic.py); backend='cpu' | 'torch' | 'triton' forces one (docs/gpu.md).
Layers (favor.torch, favor.distributed) import these, never the reverse (the
sequence-parallel ops use favor.distributed's agreement on errors, a transport concern, not a
layer; they are imported by favor.distributed, not here).
"""
from .attention import attention
from .decoder import decode_step, empty_state
from .exact import exact_attention
from .hybrid import empty_hybrid_state
from .projection import projection
from .vq import vq_attention

__all__ = ["attention", "decode_step", "empty_hybrid_state", "empty_state", "exact_attention",
           "projection", "vq_attention"]
