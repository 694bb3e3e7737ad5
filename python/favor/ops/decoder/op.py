"""favor::decode_step: append keys and values to a FAVOR decoder state, then query it.

The state is the one favor._core.Decoder.state() returns, as tensors: sums [B, H, F, Dv + 1]
float32 ([S | s] relative to exp(log_max)), log_max [B, H] float64, row_positions [B] int64
(each row's decay clock), position [1] int64. The op is functional: it returns a new state
and leaves its inputs as they were, so a compiled or exported generation loop can carry the
state as tensors (a Hugging Face cache, a device move). One token per step (T = 1) gives
row i of causal attention after tokens 0..i (on the CPU one fused C++ pass,
Decoder::step); with T > 1 every query reads the state after
all T appends (prefill with causal attention, then append).
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from ... import _args, _core
from .. import _tensors as T
from ..attention import paths
from ..attention.op import decay_list, feature_map
from . import generic


def _decoder(batch, heads, dv, w, kernel, scale, fit_a, fit_basis, weights, bias, lam, decay):
    """The favor._core.Decoder of the op's map: a projection (and fit), or a learned map
    (weights / bias / lam, a decay) built by favor::attention's rule."""
    if any(t is not None for t in (weights, bias, lam, decay)):
        fm = feature_map(w, weights, bias, lam, fit_a, fit_basis, kernel, scale)
        return _core.Decoder(batch, heads, dv, fm, decay=decay_list(decay))
    proj = _core.Projection.from_matrix(T.array(w))
    fit = None if fit_a is None else _core.KernelFit(T.array(fit_a), T.array(fit_basis))
    return _core.Decoder(batch, heads, dv, proj, kernel=kernel, scale=scale, fit=fit)


@torch.library.custom_op("favor::decode_step", mutates_args=(), device_types="cpu")
def decode_step_op(sums: Tensor, log_max: Tensor, row_positions: Tensor, position: Tensor,
                   q: Tensor, k: Tensor, v: Tensor, key_mask: Optional[Tensor], w: Tensor,
                   kernel: str, scale: Optional[float], fit_a: Optional[Tensor],
                   fit_basis: Optional[Tensor], weights: Optional[Tensor] = None,
                   bias: Optional[Tensor] = None, lam: Optional[Tensor] = None,
                   decay: Optional[Tensor] = None
                   ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(y [B, H, T, Dv] float32, sums, log_max, row_positions, position) after appending
    k [B, H, T, D], v [B, H, T, Dv] (key_mask [B, T]: nonzero = the token takes part) and
    querying q [B, H, T, D]. A learned map as in favor::attention: weights [sets, m, D],
    bias and lam [sets, m], decay float64 [1] or [H]."""
    T.follow_torch_threads()
    b, h, _, dv = v.shape
    dec = _decoder(b, h, dv, w, kernel, scale, fit_a, fit_basis, weights, bias, lam, decay)
    dec.load_state(sums=T.array(sums), log_max=T.array(log_max),
                   row_positions=T.array(row_positions), position=int(position[0]))
    keep = None if key_mask is None else T.array(key_mask.to(torch.bool))
    if q.shape[2] == 1 and k.shape[2] == 1:  # one token: the fused step (Decoder::step)
        y = T.tensor(dec.step(T.view(q), T.view(k), T.view(v), key_mask=keep))
    else:
        dec.append(T.view(k), T.view(v), key_mask=keep)
        y = T.tensor(dec.query(T.view(q)))
    st = dec.state()
    return (y, T.tensor(st["sums"]), T.tensor(st["log_max"]), T.tensor(st["row_positions"]),
            torch.tensor([st["position"]], dtype=torch.int64))


@decode_step_op.register_fake
def _(sums, log_max, row_positions, position, q, k, v, key_mask, w, kernel, scale, fit_a,
      fit_basis, weights=None, bias=None, lam=None, decay=None):
    return (q.new_empty((*q.shape[:-1], v.shape[-1]), dtype=torch.float32),
            torch.empty_like(sums), torch.empty_like(log_max), torch.empty_like(row_positions),
            torch.empty_like(position))


def empty_state(batch, heads, dv, features, device=None):
    """The state of a decoder with nothing appended: (sums, log_max, row_positions,
    position) on device (None: the default device); features = F
    (favor._core.feature_count(kernel, m))."""
    return (torch.zeros(batch, heads, features, dv + 1, device=device),
            torch.full((batch, heads), float("-inf"), dtype=torch.float64, device=device),
            torch.zeros(batch, dtype=torch.int64, device=device),
            torch.zeros(1, dtype=torch.int64, device=device))


def _map_parameter(t, name):
    """A learned-map tensor of decode_step as the op takes it (detached: no autograd)."""
    if t is None:
        return None
    T.check_tensor(t, name)
    return t.detach().to(torch.float64 if name == "decay" else torch.float32)


def decode_step(state, q, k, v, projection, *, kernel="positive", scale=None, fit=None,
                key_mask=None, weights=None, bias=None, feature_weights=None, decay=None,
                backend=None):
    """One decoder step on tensors: (y, new_state) for state = (sums, log_max, row_positions,
    position) (empty_state() to start), q/k/v [B, H, T, D or Dv] (float32 or cast to it),
    projection a float [m, D] tensor, fit None or (a, basis) float64 tensors (FAVOR++ /
    FAVOR#), key_mask [B, T] (nonzero = the token takes part; left padding). A learned map
    as favor.torch.attention's: weights [sets, m, D], bias [sets, m], feature_weights
    [sets, m] (sets 1, H or B*H), decay a tensor of gamma per head ([1] or [H]). No
    autograd. backend as favor.torch.attention's: None picks by q's device (CPU: the C++
    decoder; CUDA: the fused Triton step; other devices: torch operations,
    ops/decoder/generic.py), on the same state layout, so a state moves between devices."""
    for t, name in ((q, "q"), (k, "k"), (v, "v"), (projection, "projection")):
        T.check_tensor(t, name)
    fit_a, fit_basis = (None, None) if fit is None else fit
    lam = _map_parameter(feature_weights, "feature_weights")
    if lam is not None and lam.dim() == 1:
        lam = lam[None]  # [m]: one set, as in favor.attention
    path = T.backend(q, "q", backend)
    decay_t = None if decay is None else _map_parameter(decay, "decay").reshape(-1)
    if path != "cpu":
        return _decode_on_device(path, state, q, k, v, projection, kernel, scale, fit_a,
                                 fit_basis, key_mask, _map_parameter(weights, "weights"),
                                 _map_parameter(bias, "bias"), lam, decay_t)
    y, *new = decode_step_op(*state, q.float(), k.float(), v.float(), key_mask,
                             projection.float(), kernel, _args.optional_number(scale, "scale"),
                             fit_a, fit_basis, _map_parameter(weights, "weights"),
                             _map_parameter(bias, "bias"), lam,
                             None if decay is None else _map_parameter(decay, "decay").reshape(-1))
    return y, tuple(new)


def _decode_on_device(path, state, q, k, v, w, kernel, scale, fit_a, fit_basis, key_mask,
                      weights, bias, lam, decay):
    """decode_step on the torch path or the fused Triton step (T = 1 tokens; longer steps
    take the torch path), the map checked by C++'s rules (canonical.check_map)."""
    paths.check_inputs(q, k, v, False)
    cm = paths.device_map(q, w, weights, bias, lam, decay, fit_a, fit_basis, kernel,
                          _args.optional_number(scale, "scale"), decay is not None)
    _check_state(state, q.shape[0], q.shape[1], _core.feature_count(kernel, w.shape[0]),
                 v.shape[-1])
    check_key_mask(key_mask, q.shape[0], k.shape[2])
    state = tuple(t.to(q.device) for t in state)
    q, k, v = q.float(), k.float(), v.float()
    if path == "triton" and q.shape[2] == 1 and k.shape[2] == 1:
        from ..attention.triton_function import triton_decode_step
        return triton_decode_step(state, q, k, v, cm, key_mask)
    with torch.no_grad():
        return generic.decode_step(state, q, k, v, cm, key_mask)


def _check_state(state, batch, heads, features, dv):
    """The layout of a state tuple against the step's B, H, F and Dv (the C++ decoder checks
    its values when it loads one; on a device the values stay there)."""
    if not isinstance(state, (tuple, list)) or len(state) != 4:
        raise _core.Error("state: must be (sums, log_max, row_positions, position), as "
                          "empty_state() or decode_step returns it")
    want = ((batch, heads, features, dv + 1), (batch, heads), (batch,), (1,))
    for t, shape, name in zip(state, want, ("sums", "log_max", "row_positions", "position")):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
            got = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise _core.Error(f"state.{name}: {got} must be {list(shape)} (B, H, F, Dv + 1 "
                              "of this step)")


def check_key_mask(key_mask, batch, tokens):
    """A decoder step's key_mask: None or [B, T] (C++'s key_mask rule and message)."""
    if key_mask is None:
        return
    shape = tuple(key_mask.shape) if isinstance(key_mask, torch.Tensor) else None
    if shape != (batch, tokens):
        got = "?" if shape is None else ",".join(map(str, shape))
        raise _core.Error(f"key_mask: shape [{got}] must be [B, T] = [{batch},{tokens}]")
