"""favor.torch.vq_attention (the op favor::vq_attention, favor/ops/vq) and VQDecoder:
Transformer-VQ with torch tensors."""
from .. import _core
from ..ops import _tensors as T
from ..ops.vq import check_codebook, vq_attention  # noqa: F401
from .decoder import _Streaming


class VQDecoder(_Streaming):
    """Streaming Transformer-VQ state per (batch, head), for generation with torch tensors.

    VQDecoder(batch, heads, dv, codebook, *, scale=None, tau=0.0): the codebook tensor
    ([c, D] or [H, c, D]) is copied. append(k [B, H, T, D], v [B, H, T, Dv]); query(q
    [B, H, T, D]) -> [B, H, T, Dv] (float32; no autograd): query after appending tokens
    0..i equals row i of causal vq_attention. state_bytes is fixed whatever the position.
    """

    def __init__(self, batch, heads, dv, codebook, *, scale=None, tau=0.0):
        check_codebook(codebook)
        self._d = _core.VQDecoder(batch, heads, dv,
                                  T.view(T.as_float32(codebook.detach(), "codebook")),
                                  scale=scale, tau=float(tau))

    codes = property(lambda self: self._d.codes)
