"""favor.torch.Decoder: token-by-token generation with torch tensors."""
import numpy as np
import torch

from .. import _core, api
from ..ops.decoder import DecodeState, advance, empty_state
from .._args import fit_for
from . import _tensors as T


HYBRID = []  # [favor.torch.HybridDecoder] (hybrid_decoder.py appends it)


class Decoder:
    """Streaming FAVOR state per (batch, head), for generation with torch tensors: a thin
    owner of one DecodeState (favor.ops.decoder), advanced by the op favor::decode_step on
    the device of the tensors it is given (the state follows them there).

    Decoder(batch, heads, dv, projection=None, *, kernel='positive', scale=None, fit=None,
            feature_map=None, decay=None, backend=None):
    projection is a favor.Projection or a float [m, D] tensor; or give a favor.FeatureMap
    (learned maps; FavorAttention.feature_map()) instead; decay: gamma per head (the state
    decays by gamma at every appended token). append(k [B, H, T, D],
    v [B, H, T, Dv]); query(q [B, H, T, D]) -> [B, H, T, Dv] (float32; no autograd) reads
    the current state: query after appending tokens 0..i equals row i of causal
    attention. The state has a fixed size (state_bytes) whatever the position. backend
    forces a kernel (favor.torch.attention's; None: by the tensors' device). window, sinks
    (not both 0): a favor.torch.HybridDecoder instead (hybrid attention's state).
    """

    def __new__(cls, *args, window=0, sinks=0, **kwargs):
        # window or sinks: hybrid attention's state (favor.torch.HybridDecoder, which
        # registers itself in HYBRID when favor.torch is imported)
        if window or sinks:
            return HYBRID[0](*args, window=window, sinks=sinks, **kwargs)
        return super().__new__(cls)

    def __init__(self, batch, heads, dv, projection=None, *, kernel="positive", scale=None,
                 fit=None, feature_map=None, decay=None, backend=None, window=0, sinks=0):
        self.backend = T.check_backend(backend)
        if isinstance(projection, torch.Tensor):
            projection = T.projection_matrix(projection.detach(), projection.shape[-1])
        if feature_map is None and not isinstance(projection, _core.Projection):
            raise _core.Error("projection: must be a favor.Projection or an [m, D] tensor (or "
                              "give a feature_map)")
        if isinstance(decay, torch.Tensor):
            decay = decay.detach().double().reshape(-1).tolist()
        # The C++ decoder checks the map and options and lends its map to the CPU kernel
        # (built once; it holds no state of its own: the state is self._state).
        if feature_map is not None or decay is not None:
            self._d = api.Decoder(batch, heads, dv, projection, kernel=kernel, scale=scale,
                                  fit=fit, feature_map=feature_map, decay=decay)._d
        else:
            self._d = _core.Decoder(batch, heads, dv, projection, kernel=kernel, scale=scale,
                                    fit=fit_for(fit, kernel, projection.d))  # per head: beams reorder
        self._op_map = _op_map(projection, kernel, scale, fit, feature_map, decay,
                               (batch, heads))
        self._state = empty_state(batch, heads, dv, self._d.features, device="cpu")

    projection = property(lambda self: self._d.projection)
    batch = property(lambda self: int(self._state.sums.shape[0]))
    position = property(lambda self: int(self._state.position[0]), doc="tokens appended so far")
    state_bytes = property(lambda self: sum(t.numel() * t.element_size()
                                            for t in self._state[:3]),
                           doc="bytes of the state's arrays (sums, log_max, row_positions), as "
                               "C++'s Decoder::state_bytes")

    def _run(self, q, k, v, key_mask, mode):
        device = (q if q is not None else k).device
        T.check_device(q if q is not None else k, "q" if q is not None else "k")
        if self._state.sums.device != device:  # the state follows the tensors
            self._state = DecodeState(*(t.to(device) for t in self._state))
        if key_mask is not None and not isinstance(key_mask, torch.Tensor):
            key_mask = torch.as_tensor(key_mask)
        if q is None:  # append: no query
            q = k[:, :, :0]
        if k is None:  # query: no new token
            k = q[:, :, :0]
            v = q.new_zeros((*q.shape[:2], 0, self._d.dv))
        w, kernel, scale, fit, weights, bias, lam, decay = self._op_map
        return advance(self._state, q, k, v, w, mode=mode, kernel=kernel, scale=scale,
                       fit=fit, key_mask=key_mask, weights=weights, bias=bias,
                       feature_weights=lam, decay=decay, backend=self.backend,
                       decoder=self._d)

    def append(self, k, v, key_mask=None):
        """Adds T tokens; key_mask [B, T] (nonzero = the token takes part) leaves a masked
        token's row as it was, so left-padded batches generate."""
        self._run(None, k, v, key_mask, "append")

    def query(self, q):
        """[B, H, T, Dv] float32 on q's device: every query reads the current state."""
        return self._run(q, None, None, None, "query")

    def step(self, q, k, v, key_mask=None):
        """One decode step of every row: append(k, v, key_mask) then query(q) (q/k
        [B, H, 1, D], v [B, H, 1, Dv], key_mask [B, 1]); on the CPU one fused C++ pass."""
        return self._run(q, k, v, key_mask, "step")

    def prefill(self, q, k, v, key_mask=None):
        """Causal attention over a prompt q, k [B, H, T, D], v [B, H, T, Dv] from the
        current state -> [B, H, T, Dv], leaving the state append(k, v, key_mask) leaves; on
        the CPU one C++ call that computes the key features once (Decoder::prefill)."""
        return self._run(q, k, v, key_mask, "prefill")

    def reset(self):
        for t, fill in zip(self._state, (0.0, float("-inf"), 0, 0)):
            t.fill_(fill)

    def state(self):
        """A copy of the state as a dict (sums, log_max, row_positions tensors on the
        state's device, position an int; docs/api.md, "Decoder state"); load_state(**state)
        restores it, on this decoder or a fresh one of the same shape (bit for bit)."""
        sums, log_max, rows, position = self._state
        return dict(sums=sums.clone(), log_max=log_max.clone(), row_positions=rows.clone(),
                    position=int(position[0]))

    def load_state(self, **state):
        """Replaces the state by tensors or arrays as state() returns them, checked by the
        C++ rules (shapes and values); the state then lives on the device of sums."""
        self._d.load_state(**{name: value.detach().cpu().contiguous().numpy()
                              if isinstance(value, torch.Tensor) else value
                              for name, value in state.items()})
        st = self._d.state()
        self._d.reset()  # the C++ decoder keeps no state of its own
        sums = state.get("sums")
        device = sums.device if isinstance(sums, torch.Tensor) else torch.device("cpu")
        self._state = DecodeState(torch.from_numpy(st["sums"]).to(device),
                                  torch.from_numpy(st["log_max"]).to(device),
                                  torch.from_numpy(st["row_positions"]).to(device),
                                  torch.tensor([st["position"]], dtype=torch.int64,
                                               device=device))

    def select(self, indices):
        """Keeps batch rows indices (a list or an int tensor), in that order: the reorder of a
        beam search (rows may repeat or be dropped)."""
        if isinstance(indices, torch.Tensor):
            indices = indices.detach().cpu().reshape(-1).tolist()
        self._d.select(list(indices))  # the C++ rules (row range, per-row parameter sets)
        self._d.reset()
        idx = torch.as_tensor(list(indices), dtype=torch.int64, device=self._state.sums.device)
        sums, log_max, rows, position = self._state
        self._state = DecodeState(sums[idx], log_max[idx], rows[idx], position.clone())


def _op_map(projection, kernel, scale, fit, fm, decay, inputs):
    """The map as favor::decode_step takes it: (w [m, D] float32, kernel, scale, fit (a,
    basis) float64 or None, weights, bias, lambda float32 or None, decay float64 or None), on
    the CPU (the op moves them to the state's device); the C++ decoder has checked them."""
    if fm is not None:
        w, kernel, scale, fit = fm.projection, fm.kernel, fm.scale, fm.fit
        weights, bias, lam = fm.weights, fm.bias, fm.lambda_
    else:
        w = projection.matrix
        weights = bias = lam = None
    t = lambda a: None if a is None else torch.from_numpy(np.array(a, dtype=np.float32))  # noqa: E731
    w = torch.from_numpy(np.array(w, dtype=np.float32))
    kf = fit_for(fit, kernel, w.shape[1]) if fit is not None else None
    fit_t = None if kf is None else (torch.as_tensor(np.asarray(kf.a)),
                                     torch.as_tensor(np.asarray(kf.basis)))
    gammas = None if decay is None else torch.tensor(
        np.asarray(decay, dtype=np.float64).reshape(-1))
    lam = t(lam)
    return (w, kernel, scale, fit_t, t(weights), t(bias), lam, gammas)

