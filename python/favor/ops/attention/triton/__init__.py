"""Triton kernels of FAVOR attention for CUDA tensors (the canonical map of favor's C++
kernels; docs/numerics.md for the stabilisation):

- features.py: the feature-map prologue on a tile (x W^T on tl.dot, the key log weight, the
  kind as a constexpr epilogue, exp2), shared by the kernels; features are never stored.
- attend.py: forward(...), bidirectional (key tiles, a deterministic combine, queries) and
  causal (chunk states, a sequential scan of boundary states, chunks in parallel).
- decode.py: decode_step(...), one fused append + query kernel per head on the decoder state.
- gradients.py: backward(...), the gradients of q, k, v and the map's tensors, states
  recomputed in fp32 (a key-state pass, query tiles, feature tiles with the reverse scan,
  key tiles), deterministic.
- params.py: the wrappers' checks (ValueError naming the argument) and launch parameters.

Plain functions on torch tensors (no autograd): favor::attention's CUDA kernels call them under the op's autograd formula
(ops/attention/kernels.py).
"""
from .gradients import backward
from .decode import decode_step
from .attend import forward

__all__ = ["backward", "decode_step", "forward"]
