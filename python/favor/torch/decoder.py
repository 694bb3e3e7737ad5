"""favor.torch.Decoder: token-by-token generation with torch tensors."""
import torch

from .. import _core, api
from ..api import _fit
from . import _tensors as T


class _Streaming:
    """What Decoder and VQDecoder share: calls of the _core decoder held in self._d with
    torch tensors (float32 views in, a tensor sharing the result's memory out)."""

    def append(self, k, v):
        T.follow_torch_threads()
        self._d.append(T.view(T.as_float32(k, "k")), T.view(T.as_float32(v, "v")))

    def query(self, q):
        T.follow_torch_threads()
        return T.tensor(self._d.query(T.view(T.as_float32(q, "q"))))

    def reset(self):
        self._d.reset()

    position = property(lambda self: self._d.position, doc="tokens appended so far")
    state_bytes = property(lambda self: self._d.state_bytes)


class Decoder(_Streaming):
    """Streaming FAVOR state per (batch, head), for generation with torch tensors.

    Decoder(batch, heads, dv, projection=None, *, kernel='positive', scale=None, fit=None,
            feature_map=None, decay=None):
    projection is a favor.Projection or a float [m, D] tensor; or give a favor.FeatureMap
    (learned maps; FavorAttention.feature_map()) instead; decay: gamma per head (the state
    decays by gamma at every appended token). append(k [B, H, T, D],
    v [B, H, T, Dv]); query(q [B, H, T, D]) -> [B, H, T, Dv] (float32; no autograd) reads
    the current state: query after appending tokens 0..i equals row i of causal
    attention. The state has a fixed size (state_bytes) whatever the position.
    """

    def __init__(self, batch, heads, dv, projection=None, *, kernel="positive", scale=None,
                 fit=None, feature_map=None, decay=None):
        if isinstance(projection, torch.Tensor):
            projection = T.projection_matrix(projection.detach(), projection.shape[-1])
        if feature_map is None and not isinstance(projection, _core.Projection):
            raise _core.Error("projection: must be a favor.Projection or an [m, D] tensor (or "
                              "give a feature_map)")
        if isinstance(decay, torch.Tensor):
            decay = decay.detach().double().reshape(-1).tolist()
        if feature_map is not None or decay is not None:
            # the numpy Decoder checks and builds the map (api.Decoder)
            self._d = api.Decoder(batch, heads, dv, projection, kernel=kernel, scale=scale,
                                  fit=fit, feature_map=feature_map, decay=decay)._d
            return
        self._d = _core.Decoder(batch, heads, dv, projection, kernel=kernel, scale=scale,
                                fit=_fit(fit, kernel, projection.d, (batch, heads)))

    projection = property(lambda self: self._d.projection)
