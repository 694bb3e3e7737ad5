"""favor.torch.HybridDecoder: token-by-token generation with hybrid attention (exact softmax on
the last `window` tokens and the first `sinks` kept ones, FAVOR's estimator on the rest, one
normaliser; docs/math.md, "Hybrid attention"): a thin owner of one HybridDecodeState
(favor.ops.hybrid), advanced by the op favor::hybrid_decode_step on the device of the
tensors it is given (on the CPU one fused C++ call per step)."""
import torch

from .. import _core
from .._args import hybrid_sizes
from ..ops.hybrid.op import (HybridDecodeState, advance, check_state, empty_hybrid_state,
                             hybrid_decoder)
from . import _tensors as T
from .decoder import HYBRID, Decoder


class HybridDecoder:
    """Streaming hybrid attention state per (batch, head).

    HybridDecoder(batch, heads, dv, projection=None, *, window, sinks=0, kernel='positive',
                  scale=None, fit=None, feature_map=None, decay=None, backend=None,
                  estimate=True)
    (the arguments of favor.torch.Decoder, plus window >= 0 and sinks >= 0, not both 0).
    prefill(q, k, v, key_mask=None) -> causal hybrid attention over a prompt (the rows of
    favor.torch.attention(..., causal=True, window, sinks)), leaving its state; step(q, k, v,
    key_mask=None) one token per row; append(k, v, key_mask=None); query(q); select(indices)
    (beam search); state() / load_state(**state); state_bytes (fixed by window, sinks and the
    map). estimate=False keeps the window and the sinks alone (method='window': no linear
    state). Every call is favor::hybrid_decode_step on the one state (no host sync outside
    the op: a step compiles with torch.compile(fullgraph=True)).
    """

    def __init__(self, batch, heads, dv, projection=None, *, window, sinks=0,
                 kernel="positive", scale=None, fit=None, feature_map=None, decay=None,
                 backend=None, estimate=True):
        window, sinks = hybrid_sizes(window, sinks, check=True)
        if window == 0 and sinks == 0:
            raise _core.Error("window, sinks: both 0 is the plain method; use "
                              "favor.torch.Decoder")
        # the plain decoder's checks of the map and its tensors as the op takes them
        plain = Decoder(batch, heads, dv, projection, kernel=kernel, scale=scale, fit=fit,
                        feature_map=feature_map, decay=decay, backend=backend)
        self.backend, self._op_map = plain.backend, plain._op_map
        self.window, self.sinks, self.dv, self.heads = window, sinks, dv, heads
        self.estimate = bool(estimate)  # False: the window and the sinks alone
        w, kernel, scale, fit_t, weights, bias, lam, gammas = self._op_map
        self.d = w.shape[1]
        self._features = plain._d.features if self.estimate else 0
        # the C++ decoder lends its map to eager CPU calls (it holds no state of its own)
        self._d = hybrid_decoder(batch, heads, dv, w, kernel, scale,
                                 *((None, None) if fit_t is None else fit_t), weights, bias,
                                 lam, gammas, window, sinks) if self.estimate else None
        self._rules = self._d if self._d is not None else plain._d  # select's rules
        self._state = self._empty(batch, torch.device("cpu"))

    def _empty(self, batch, device):
        return empty_hybrid_state(batch, self.heads, self.dv, self._features, self.d,
                                  self.window, self.sinks, device=device)

    batch = property(lambda self: int(self._state.sums.shape[0]))
    position = property(lambda self: int(self._state.position[0]), doc="tokens seen")
    state_bytes = property(lambda self: sum(t.numel() * t.element_size() for t in self._state
                                            if t is not self._state.position),
                           doc="bytes of the state: the linear state (estimate=True), the "
                               "ring and the sinks (fixed)")

    def _run(self, q, k, v, key_mask, mode):
        x = q if q is not None else k
        T.check_device(x, "q" if q is not None else "k")
        if self._state.sums.device != x.device:  # the state follows the tensors
            self._state = HybridDecodeState(*(t.to(x.device) for t in self._state))
        if key_mask is not None and not isinstance(key_mask, torch.Tensor):
            key_mask = torch.as_tensor(key_mask)
        if q is None:  # append: no query
            q = k[:, :, :0]
        if k is None:  # query: no new token
            k = q[:, :, :0]
            v = q.new_zeros((*q.shape[:2], 0, self.dv))
        w, kernel, scale, fit, weights, bias, lam, decay = self._op_map
        return advance(self._state, q.detach(), k.detach(), v.detach(), w, window=self.window,
                       sinks=self.sinks, estimate=self.estimate, mode=mode, kernel=kernel,
                       scale=scale, fit=fit, key_mask=key_mask, weights=weights, bias=bias,
                       feature_weights=lam, decay=decay, backend=self.backend,
                       decoder=self._d)

    def append(self, k, v, key_mask=None):
        """Adds T tokens (key_mask [B, T]: nonzero = the token takes part)."""
        self._run(None, k, v, key_mask, "append")

    def query(self, q):
        """[B, H, T, Dv] float32: each query reads the current state (the ring as it is)."""
        return self._run(q, None, None, None, "query")

    def step(self, q, k, v, key_mask=None):
        """One token per row (q, k [B, H, 1, D], v [B, H, 1, Dv], key_mask [B, 1]): append,
        then query, in one op call (one fused C++ call on the CPU)."""
        return self._run(q, k, v, key_mask, "step")

    def prefill(self, q, k, v, key_mask=None):
        """Causal hybrid attention over a prompt -> [B, H, T, Dv], leaving the state: from an
        empty state one attention call and the state built from the prompt; after earlier
        tokens, token by token."""
        return self._run(q, k, v, key_mask, "prefill")

    def reset(self):
        self._state = self._empty(self.batch, self._state.sums.device)

    def state(self):
        """A copy of the state as a dict of tensors on the state's device (the
        HybridDecodeState's fields; position an int); load_state(**state) restores it, on
        this decoder or a fresh one of the same shape (bit for bit)."""
        out = {name: t.clone() for name, t in zip(HybridDecodeState._fields, self._state)}
        out["position"] = int(self._state.position[0])
        return out

    def load_state(self, **state):
        """Replaces the state by tensors or arrays as state() returns them, checked by the
        C++ rules (HybridDecoder::load_state: shapes and values); the state then lives on the
        device of sums."""
        position = state.get("position")
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
            raise _core.Error(f"position: {position!r} must be an integer >= 0")
        names = [n for n in HybridDecodeState._fields if n != "position"]
        missing = [n for n in names if n not in state]
        if missing:
            raise _core.Error(f"state: missing {', '.join(missing)} (load_state(**state()))")
        sums = state["sums"]
        device = sums.device if isinstance(sums, torch.Tensor) else torch.device("cpu")
        as_tensor = lambda x: x.detach().to("cpu") if isinstance(x, torch.Tensor) \
            else torch.as_tensor(x)  # noqa: E731
        given = {n: as_tensor(state[n]) for n in names}
        if self._d is not None:  # the C++ rules, values included
            self._d.load_state(position=position, **{n: t.contiguous().numpy()
                                                     for n, t in given.items()})
        new = HybridDecodeState(*(torch.tensor([position]) if n == "position" else given[n]
                                  for n in HybridDecodeState._fields))
        check_state(new, self.batch, self.heads, self._features, self.d, self.dv, self.window,
                    self.sinks)
        self._state = HybridDecodeState(*(t.to(device).clone() for t in new))

    def select(self, indices):
        """Keeps batch rows `indices` in that order (beam search; the C++ rules: each in
        [0, batch), a map with per-(batch, head) parameters cannot be reordered)."""
        if isinstance(indices, torch.Tensor):
            indices = indices.detach().cpu().reshape(-1).tolist()
        indices = [int(i) for i in indices]
        self._rules.select(indices)
        idx = torch.as_tensor(indices, dtype=torch.int64, device=self._state.sums.device)
        self._state = HybridDecodeState(*(t.clone() if t is self._state.position else t[idx]
                                          for t in self._state))


HYBRID.append(HybridDecoder)  # favor.torch.Decoder(..., window=, sinks=) makes one
