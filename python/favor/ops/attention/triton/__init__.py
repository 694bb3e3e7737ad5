"""Triton kernels of FAVOR attention for CUDA tensors (the canonical map of favor's C++
kernels; docs/numerics.md for the stabilisation):

- features.py: the feature-map prologue on a tile (x W^T on tl.dot, the key log weight, the
  kind as a constexpr epilogue, exp2), shared by the kernels; features are never stored.
- forward.py: forward(...), bidirectional (key tiles, a deterministic combine, queries) and
  causal (chunk states, a sequential scan of boundary states, chunks in parallel).
- decode.py: decode_step(...), one fused append + query kernel per head on the decoder state.
- params.py: the wrappers' checks (ValueError naming the argument) and launch parameters.

Plain functions on torch tensors (no autograd): the torch op and its backward are built on
them elsewhere.
"""
from .decode import decode_step
from .forward import forward

__all__ = ["decode_step", "forward"]
