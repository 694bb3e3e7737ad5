"""favor.torch.HybridDecoder: token-by-token generation with hybrid attention (exact softmax on
the last `window` tokens and the first `sinks` kept ones, FAVOR's estimator on the rest, one
normaliser; docs/math.md, "Hybrid attention").

The state, fixed by (batch, heads, window, sinks, m), whatever the position:
- a ring of the last `window` keys and values (slot t % window holds token t) with, per row,
  whether the token takes part (key mask) and whether it is a sink;
- the sinks: each row's first `sinks` kept tokens (left padding moves them), their keys,
  values and positions;
- the linear state of every other token that has left the window: a favor.torch.Decoder fed
  the evicted tokens (a token is folded in as phi(k) [v | 1]^T when it leaves the window, so
  its decay runs from the window's edge, as favor.torch.attention's).
A step pushes the new token (evicting the one `window` tokens back into the linear state)
and reads the exact part from the ring and the sinks and the estimated part from the linear
state, merged in log space like the attention op's parts. Plain torch operations on the
tensors' device (the linear state's append runs favor::decode_step's kernel there).
"""
import math

import torch

from .. import _core
from .._args import hybrid_sizes
from ..ops.attention import generic
from ..ops.attention.canonical import TRIG, canonical_map
from ..ops.attention.hybrid import pair_log_const
from . import _tensors as T
from ..ops.decoder import empty_state
from .decoder import HYBRID, Decoder
from .function import attention


class HybridDecoder:
    """Streaming hybrid attention state per (batch, head).

    HybridDecoder(batch, heads, dv, projection=None, *, window, sinks=0, kernel='positive',
                  scale=None, fit=None, feature_map=None, decay=None, backend=None)
    (the arguments of favor.torch.Decoder, plus window >= 0 and sinks >= 0, not both 0).
    prefill(q, k, v, key_mask=None) -> causal hybrid attention over a prompt (the rows of
    favor.torch.attention(..., causal=True, window, sinks)), leaving its state; step(q, k, v,
    key_mask=None) one token per row; append(k, v, key_mask=None); query(q); select(indices)
    (beam search); state_bytes (fixed by window, sinks and the map). estimate=False keeps
    the window and the sinks alone (method='window': no linear state is read or fed).
    engine=True: a prompt of CPU tensors outside autograd makes the state favor's C++
    favor::HybridDecoder (favor.Decoder(..., window, sinks): one fused call per step, where
    these torch operations take ~20); every later call runs there, and state() /
    load_state() are refused (its state is the C++ decoder's, favor.Decoder.state()). The
    HF cache layers use it (favor.hf); the rows are the same attention either way.
    """

    def __init__(self, batch, heads, dv, projection=None, *, window, sinks=0,
                 kernel="positive", scale=None, fit=None, feature_map=None, decay=None,
                 backend=None, estimate=True, engine=False):
        window, sinks = hybrid_sizes(window, sinks, check=True)
        if window == 0 and sinks == 0:
            raise _core.Error("window, sinks: both 0 is the plain method; use "
                              "favor.torch.Decoder")
        self.linear = Decoder(batch, heads, dv, projection, kernel=kernel, scale=scale, fit=fit,
                              feature_map=feature_map, decay=decay, backend=backend)
        self.window, self.sinks, self.dv, self.heads = window, sinks, dv, heads
        self.estimate = bool(estimate)  # False: the window and the sinks alone
        w, kernel, scale, fit_t, weights, bias, lam, gammas = self.linear._op_map
        self._attention_map = dict(kernel=kernel, scale=scale, weights=weights, bias=bias,
                                   feature_weights=lam, decay=gammas, fit=fit_t, projection=w)
        self.d = w.shape[1]
        self.scale = self.d ** -0.5 if scale is None else float(scale)
        self._map = (w, weights, bias, lam, gammas, fit_t, kernel, scale)
        self._log_const = pair_log_const(kernel, w.shape[0],
                                         None if fit_t is None else fit_t[0])
        self._cm = None
        self._empty(batch, torch.device("cpu"))
        # the C++ engine's arguments (favor.Decoder), when it may be used: FAVOR++ / FAVOR#
        # fits and the window alone (estimate=False) stay on the torch operations
        self._engine, self._engine_args = None, None
        if engine and self.estimate and fit is None:
            proj = projection
            if isinstance(proj, torch.Tensor):  # as favor.torch.Decoder takes it
                proj = T.projection_matrix(proj.detach(), proj.shape[-1])
            drawn = {} if feature_map is not None else dict(kernel=kernel, scale=scale)
            self._engine_args = dict(batch=batch, heads=heads, dv=dv, projection=proj,
                                     feature_map=feature_map, decay=decay, window=window,
                                     sinks=sinks, **drawn)  # a feature_map carries the rest

    # ------------------------------------------------------------------ state

    def _empty(self, batch, device):
        h, w, s, d, dv = self.heads, self.window, self.sinks, self.d, self.dv
        z = lambda *shape, dtype=torch.float32: torch.zeros(*shape, dtype=dtype,  # noqa: E731
                                                             device=device)
        self.ring_k, self.ring_v = z(batch, h, w, d), z(batch, h, w, dv)
        self.ring_keep = z(batch, w, dtype=torch.bool)
        self.ring_sink = z(batch, w, dtype=torch.bool)
        self.sink_k, self.sink_v = z(batch, h, s, d), z(batch, h, s, dv)
        self.sink_pos = torch.full((batch, s), -1, dtype=torch.int64, device=device)
        self.position = 0

    def _tensors(self):
        return (self.ring_k, self.ring_v, self.ring_keep, self.ring_sink, self.sink_k,
                self.sink_v, self.sink_pos)

    def _follow(self, device):
        if self.ring_k.device != device:
            (self.ring_k, self.ring_v, self.ring_keep, self.ring_sink, self.sink_k,
             self.sink_v, self.sink_pos) = (t.to(device) for t in self._tensors())
            self._cm = None

    @property
    def batch(self):
        return self._engine.batch if self._engine is not None else int(self.ring_k.shape[0])

    @property
    def state_bytes(self):
        """bytes of the state: the linear state (estimate=True), the ring and the sinks
        (fixed)"""
        if self._engine is not None:
            return self._engine.state_bytes
        return (self.linear.state_bytes if self.estimate else 0) + sum(
            t.numel() * t.element_size() for t in self._tensors())

    def reset(self):
        if self._engine is not None:
            self._engine.reset()
            return
        self.linear.reset()
        self._empty(self.batch, self.ring_k.device)

    # ------------------------------------------------------------------ C++ engine

    def _use_engine(self, x):
        """Whether this call runs on the C++ engine: once made, always; it is made at the
        first tokens from an empty state when they are CPU tensors outside autograd."""
        if self._engine is not None:
            return True
        if self._engine_args is None or self.position > 0 or x.device.type != "cpu" or \
                (torch.is_grad_enabled() and x.requires_grad):
            return False
        from .. import api
        a = dict(self._engine_args)
        self._engine = api.Decoder(a.pop("batch"), a.pop("heads"), a.pop("dv"),
                                   a.pop("projection"), **a)
        # the engine holds the state from now on: the torch state's tensors go
        self._empty(0, torch.device("cpu"))
        self.linear._state = empty_state(0, self.heads, self.dv, self.linear._d.features)
        self.linear._d = None  # (its C++ decoder too)
        return True

    @staticmethod
    def _np(x):
        # a strided view, not a copy: favor's C++ calls read any strides
        return x.detach().float().numpy()

    @staticmethod
    def _np_mask(key_mask):
        return None if key_mask is None else \
            torch.as_tensor(key_mask).ne(0).to(torch.uint8).contiguous().numpy()

    _FIELDS = ("ring_k", "ring_v", "ring_keep", "ring_sink", "sink_k", "sink_v", "sink_pos")

    def _no_engine(self, what):
        if self._engine is not None:
            raise _core.Error(f"{what}: this decoder runs on the C++ engine (engine=True), whose "
                              "state is favor.Decoder's; make one with engine=False")

    def state(self):
        """A copy of the state as a dict: the linear state (Decoder.state(): sums, log_max,
        row_positions), the ring and the sinks (tensors on the state's device) and the int
        position; load_state(**state) restores it (bit for bit)."""
        self._no_engine("state")
        out = {f"linear_{k}": v for k, v in self.linear.state().items()}
        out.update({name: getattr(self, name).clone() for name in self._FIELDS})
        out["position"] = self.position
        return out

    def load_state(self, **state):
        """Replaces the state by one state() gave (checked: the linear part by the C++
        rules, the ring and sinks against this decoder's shapes)."""
        self._no_engine("load_state")
        linear = {k[len("linear_"):]: v for k, v in state.items() if k.startswith("linear_")}
        self.linear.load_state(**linear)
        for name in self._FIELDS:
            want, got = getattr(self, name), state.get(name)
            if not isinstance(got, torch.Tensor) or got.dtype != want.dtype or \
                    got.shape[1:] != want.shape[1:] or got.shape[0] != self.linear.batch:
                raise _core.Error(f"{name}: must be a {want.dtype} tensor of shape "
                                  f"[{self.linear.batch}, {', '.join(map(str, want.shape[1:]))}]")
        device = state["ring_k"].device
        for name in self._FIELDS:
            setattr(self, name, state[name].detach().to(device).clone())
        position = state.get("position")
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
            raise _core.Error(f"position: {position!r} must be an integer >= 0")
        self.position = position
        self._cm = None

    def select(self, indices):
        """Keeps batch rows `indices` in that order (beam search)."""
        if self._engine is not None:
            self._engine.select([int(i) for i in (indices.tolist() if isinstance(
                indices, torch.Tensor) else indices)])
            return
        self.linear.select(indices)
        idx = torch.as_tensor(indices.tolist() if isinstance(indices, torch.Tensor)
                              else list(indices), dtype=torch.int64, device=self.ring_k.device)
        (self.ring_k, self.ring_v, self.ring_keep, self.ring_sink, self.sink_k, self.sink_v,
         self.sink_pos) = (t[idx] for t in self._tensors())

    # ------------------------------------------------------------------ tokens

    @staticmethod
    def _keep(key_mask, b, t, device):
        if key_mask is None:
            return torch.ones(b, t, dtype=torch.bool, device=device)
        return torch.as_tensor(key_mask).to(device).ne(0).reshape(b, t)

    def _push(self, k, v, keep):
        """Token `position` (k, v [B, H, 1, .], keep [B]) enters: the token one window back
        leaves the ring for the linear state (sinks never do), the first kept tokens become
        sinks."""
        t, w = self.position, self.window
        count = (self.sink_pos >= 0).sum(1)
        sink = keep & (count < self.sinks)
        if bool(sink.any()):
            rows = sink.nonzero().squeeze(1)
            slot = count[rows]
            self.sink_k[rows, :, slot] = k[rows, :, 0]
            self.sink_v[rows, :, slot] = v[rows, :, 0]
            self.sink_pos[rows, slot] = t
        if w == 0:
            if self.estimate:
                self.linear.append(k, v, key_mask=(keep & ~sink)[:, None])
        else:
            slot = t % w
            if t >= w and self.estimate:
                leaving = self.ring_keep[:, slot] & ~self.ring_sink[:, slot]
                self.linear.append(self.ring_k[:, :, slot:slot + 1],
                                   self.ring_v[:, :, slot:slot + 1], key_mask=leaving[:, None])
            self.ring_k[:, :, slot] = k[:, :, 0]
            self.ring_v[:, :, slot] = v[:, :, 0]
            self.ring_keep[:, slot] = keep
            self.ring_sink[:, slot] = sink
        self.position = t + 1

    def _canonical(self, device):
        if self._cm is None:
            w, weights, bias, lam, gammas, fit_t, kernel, scale = self._map
            to = lambda x: None if x is None else x.to(device)  # noqa: E731
            fit_a, fit_b = (None, None) if fit_t is None else (to(fit_t[0]), to(fit_t[1]))
            self._cm = canonical_map(to(w), to(weights), to(bias), to(lam), to(gammas), fit_a,
                                     fit_b, kernel, scale, self.d)
        return self._cm

    def _exact_part(self, q):
        """The window's and the sinks' terms for q [B, H, T, D]: ([num | den] [B, H, T, Dv + 1],
        their log scale [B, H, T])."""
        t, w = self.position - 1, self.window
        keys = torch.cat([self.ring_k, self.sink_k], 2)
        values = torch.cat([self.ring_v, self.sink_v], 2)
        outside = (self.sink_pos >= 0) & (self.sink_pos <= t - w)      # sinks not in the ring
        live = torch.cat([self.ring_keep, outside], 1)                    # [B, w + s]
        scores = (q @ keys.transpose(-1, -2)) * self.scale               # [B, H, T, w + s]
        scores = scores.masked_fill(~live[:, None, None, :], -math.inf)
        top = scores.amax(-1, keepdim=True)
        safe = top.masked_fill(torch.isinf(top), 0.0)
        p = torch.exp(scores - safe)
        num = torch.cat([p @ values, p.sum(-1, keepdim=True)], -1)
        return num, top.squeeze(-1).double()

    def _linear_part(self, q):
        """The estimated terms for q [B, H, T, D] from the linear state."""
        sums, log_max, rows, _ = (t.to(q.device) for t in self.linear._state)
        b, h, tq, _ = q.shape
        cm = self._canonical(q.device)
        sx = sums.reshape(b * h, *sums.shape[2:])
        lq = generic.query_logits(q.reshape(b * h, tq, -1), cm)
        if cm.kind == TRIG:
            psi, c = lq, torch.zeros(b * h, tq, 1, dtype=lq.dtype, device=q.device)
        else:
            psi, c = generic.shifted(lq, sx[..., self.dv].unsqueeze(1), with_shift=True)
        out = (psi @ sx).reshape(b, h, tq, -1)
        extra = cm.norm_coef * (q.double() ** 2).sum(-1)                   # [B, H, T]
        lc = self._log_const  # a float, or one per fit set: head bh takes set bh % sets
        if torch.is_tensor(lc):
            lc = lc.to(q.device).double().reshape(-1)
            lc = lc[torch.arange(b * h, device=q.device) % lc.numel()].reshape(b, h, 1)
        extra = extra + lc
        if cm.rate is not None:  # the query's clock: the last folded token's
            rate = cm.rate.to(q.device).reshape(-1)
            rate = rate.expand(h) if rate.numel() == 1 else rate
            clock = (rows.to(q.device) - 1).double()
            extra = extra - rate[None, :, None] * clock[:, None, None]
        scale = c.reshape(b, h, tq).double() + log_max.to(q.device)[..., None] + extra
        return out, scale.masked_fill(torch.isinf(log_max.to(q.device))[..., None], -math.inf)

    def query(self, q):
        """[B, H, T, Dv] float32: each query reads the current state (the ring as it is)."""
        if self._engine is not None:
            return torch.from_numpy(self._engine.query(self._np(q))).to(q.device)
        q = q.detach().float()
        self._follow(q.device)
        parts = [self._exact_part(q)] + ([self._linear_part(q)] if self.estimate else [])
        top = torch.stack([s for _, s in parts]).amax(0)
        top = top.masked_fill(torch.isinf(top), 0.0)
        acc = sum(torch.exp(s - top).float().unsqueeze(-1) * out for out, s in parts)
        return generic.ratio(acc, self.dv)

    def append(self, k, v, key_mask=None):
        """Adds T tokens (key_mask [B, T]: nonzero = the token takes part)."""
        if self._use_engine(k):
            self._engine.append(self._np(k), self._np(v), key_mask=self._np_mask(key_mask))
            return
        k, v = k.detach().float(), v.detach().float()
        self._follow(k.device)
        keep = self._keep(key_mask, k.shape[0], k.shape[2], k.device)
        if self.position == 0:  # from an empty state: in bulk
            self._build(k, v, keep)
            return
        for i in range(k.shape[2]):
            self._push(k[:, :, i:i + 1], v[:, :, i:i + 1], keep[:, i])

    def step(self, q, k, v, key_mask=None):
        """One token per row (q, k [B, H, 1, D], v [B, H, 1, Dv], key_mask [B, 1]): append,
        then query."""
        if q.shape[2] != 1:
            raise _core.Error(f"q: a step takes one token per row, got {q.shape[2]}")
        if self._use_engine(q):
            return torch.from_numpy(self._engine.step(self._np(q), self._np(k), self._np(v),
                                                      key_mask=self._np_mask(key_mask)))
        self.append(k, v, key_mask)
        return self.query(q)

    def prefill(self, q, k, v, key_mask=None):
        """Causal hybrid attention over a prompt -> [B, H, T, Dv], leaving the state: from an
        empty state, favor.torch.attention (one call) and the state built from the prompt;
        after earlier tokens, token by token."""
        if self._use_engine(q):
            return torch.from_numpy(self._engine.prefill(self._np(q), self._np(k), self._np(v),
                                                         key_mask=self._np_mask(key_mask)))
        if self.position > 0:
            return torch.cat([self.step(q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1],
                                        None if key_mask is None else
                                        torch.as_tensor(key_mask)[:, i:i + 1])
                              for i in range(q.shape[2])], 2)
        keep = self._keep(key_mask, k.shape[0], k.shape[2], k.device)
        m = self._attention_map if self.estimate else dict(method="window",
                                                             scale=self._attention_map["scale"])
        y = attention(q.detach().float(), k.detach().float(), v.detach().float(), causal=True,
                      window=self.window, sinks=self.sinks, key_padding_mask=~keep,
                      backend=self.linear.backend, **m)
        self._build(k.detach().float(), v.detach().float(), keep)
        return y

    def _build(self, k, v, keep):
        """The state after the prompt k, v [B, H, T, .] from an empty one, in bulk."""
        self._follow(k.device)
        t, w = k.shape[2], self.window
        rank = keep.long().cumsum(1)
        sink = keep & (rank <= self.sinks)                                   # [B, T]
        for b in range(k.shape[0]):
            pos = sink[b].nonzero().squeeze(1)
            self.sink_k[b, :, :len(pos)] = k[b, :, pos]
            self.sink_v[b, :, :len(pos)] = v[b, :, pos]
            self.sink_pos[b, :len(pos)] = pos
        folded = max(t - w, 0)
        if folded and self.estimate:
            self.linear.append(k[:, :, :folded], v[:, :, :folded],
                               key_mask=(keep & ~sink)[:, :folded])
        for p in range(folded, t):
            slot = p % w
            self.ring_k[:, :, slot] = k[:, :, p]
            self.ring_v[:, :, slot] = v[:, :, p]
            self.ring_keep[:, slot] = keep[:, p]
            self.ring_sink[:, slot] = sink[:, p]
        self.position = t


HYBRID.append(HybridDecoder)  # favor.torch.Decoder(..., window=, sinks=) makes one
