"""Hybrid attention's Triton kernels for CUDA tensors (the plain estimator's are
ops/attention/triton/, whose feature prologue, checks and token tile decode.py shares):

- band.py: band(...), the exact part of a forward (the window inside the tile, then the sinks),
  [num | den] rows at their max; favor::attention's CUDA kernel adds the estimated parts and
  the merge in torch (chunk.py).
- decode.py: hybrid_decode_step(...), favor::hybrid_decode_step's CUDA kernel: the push and
  the query of one token in one kernel on the HybridDecodeState, in place.

Plain functions on torch tensors (no autograd); importing this module imports triton.
"""
from .band import band
from .decode import hybrid_decode_step

__all__ = ["band", "hybrid_decode_step"]
