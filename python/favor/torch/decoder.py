"""favor.torch.Decoder: token-by-token generation with torch tensors."""
import torch

from .. import _core, api
from .._args import fit_for
from . import _tensors as T


class _Streaming:
    """What Decoder and VQDecoder share: calls of the _core decoder held in self._d with
    torch tensors (float32 views in, a tensor sharing the result's memory out)."""

    def append(self, k, v, key_mask=None):
        """Adds T tokens; key_mask [B, T] (nonzero = the token takes part) leaves a masked
        token's row as it was, so left-padded batches generate."""
        T.follow_torch_threads()
        keep = key_mask.detach().cpu().ne(0).numpy() if isinstance(key_mask, torch.Tensor) \
            else key_mask
        self._d.append(T.view(T.as_float32(k, "k")), T.view(T.as_float32(v, "v")),
                       key_mask=keep)

    def query(self, q):
        T.follow_torch_threads()
        return T.tensor(self._d.query(T.view(T.as_float32(q, "q"))))

    def reset(self):
        self._d.reset()

    def state(self):
        """A copy of the state as CPU tensors and the int 'position' (Decoder: sums, log_max,
        row_positions; VQDecoder: sums, counts; docs/api.md, "Decoder state");
        load_state(**state) restores it, on this decoder or a fresh one of the same shape
        (bit for bit)."""
        return {name: value if name == "position" else T.tensor(value)
                for name, value in self._d.state().items()}

    def load_state(self, **state):
        """Replaces the state by tensors or arrays as state() returns them (checked; a tensor
        on another device is copied to the CPU)."""
        self._d.load_state(**{name: value.detach().cpu().contiguous().numpy()
                              if isinstance(value, torch.Tensor) else value
                              for name, value in state.items()})

    def select(self, indices):
        """Keeps batch rows indices (a list or an int tensor), in that order: the reorder of a
        beam search (rows may repeat or be dropped)."""
        if isinstance(indices, torch.Tensor):
            indices = indices.detach().cpu().reshape(-1).tolist()
        self._d.select(list(indices))

    position = property(lambda self: self._d.position, doc="tokens appended so far")
    batch = property(lambda self: self._d.batch)
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
                                fit=fit_for(fit, kernel, projection.d, (batch, heads)))

    projection = property(lambda self: self._d.projection)
