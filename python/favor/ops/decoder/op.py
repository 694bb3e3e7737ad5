"""favor::decode_step: FAVOR's streaming decoder as one torch op on one state (DecodeState):
append keys and values, query, one fused step, or a prompt's prefill.

The state is the C++ DecoderState's layout as tensors, advanced in place by the op (the CPU
kernel borrows its memory: DecoderStateView), so its owner keeps the same tensors from the
first token to the last: favor.torch.Decoder, the Hugging Face cache layer (favor.hf), a
compiled or exported loop of your own. decode_step() is the functional form (a new state
out, the input left as it was). One token per step (T = 1) gives row i of causal attention
after tokens 0..i (on the CPU one fused C++ pass, Decoder::step).
"""
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from ... import _args, _core
from .. import _dispatch
from .. import _tensors as T
from ..attention import paths
from ..attention.layout import decay_list, feature_map
from ..attention.op import eager_mode
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


class DecodeState(NamedTuple):
    """favor's decoding state, one definition for every device and every owner (favor.torch
    .Decoder, the Hugging Face cache layer, a loop of your own): the C++ DecoderState's
    layout (include/favor/decoder_state.hpp) as tensors, which the CPU kernel reads and
    writes in place through a DecoderStateView. sums [B, H, F, Dv + 1] float32 ([S | s]
    relative to exp(log_max)), log_max [B, H] float64 (-inf: no key yet), row_positions [B]
    int64 (each row's decay clock: its kept tokens), position [1] int64 (tokens appended).
    Its size is fixed by (B, H, F, Dv), whatever the position. New fields go at the end."""
    sums: Tensor
    log_max: Tensor
    row_positions: Tensor
    position: Tensor


MODES = ("step", "append", "query", "append_query", "prefill")


def _generic(sums, log_max, row_positions, position, q, k, v, key_mask, w, kernel, scale, fit_a,
             fit_basis, weights, bias, lam, decay, step_kind):
    """The torch kernel on new tensors: (y, new state)."""
    check_step_inputs(q, k, v, key_mask, step_kind)
    cm = paths.device_map(q, w, weights, bias, lam, decay, fit_a, fit_basis, kernel, scale,
                          decay is not None)
    state = (sums, log_max, row_positions, position)
    q, k, v = q.float(), k.float(), v.float()
    if step_kind == "append":
        return q.new_empty((*q.shape[:-1], v.shape[-1])), generic.append(state, k, v, cm,
                                                                        key_mask)
    if step_kind == "query":
        return generic.query(state, q, cm), state
    if step_kind != "prefill":
        return generic.decode_step(state, q, k, v, cm, key_mask)
    if decay is None and int(position[0]) == 0:  # a prompt: its key features once
        return generic.prefill(state, q, k, v, cm, key_mask)
    rows = []
    for i in range(q.shape[2]):  # causal: token i reads the state after its own append
        sl = slice(i, i + 1)
        y, state = generic.decode_step(state, q[:, :, sl], k[:, :, sl], v[:, :, sl], cm,
                                       None if key_mask is None else key_mask[:, sl])
        rows.append(y)
    return torch.cat(rows, dim=2), state


def _write(state, new):
    """The in-place update of the op's state arguments."""
    for t, n in zip(state, new):
        t.copy_(n)


@torch.library.custom_op("favor::decode_step",
                         mutates_args=("sums", "log_max", "row_positions", "position"),
                         device_types=None)
def decode_step_op(sums: Tensor, log_max: Tensor, row_positions: Tensor, position: Tensor,
                   q: Tensor, k: Tensor, v: Tensor, key_mask: Optional[Tensor], w: Tensor,
                   kernel: str, scale: Optional[float], fit_a: Optional[Tensor],
                   fit_basis: Optional[Tensor], weights: Optional[Tensor],
                   bias: Optional[Tensor], lam: Optional[Tensor], decay: Optional[Tensor],
                   step_kind: str) -> Tensor:
    """y [B, H, T, Dv] float32, the state (sums, log_max, row_positions, position: a
    DecodeState) advanced in place. step_kind 'step' (T = 1: append then query, fused on the CPU),
    'append_query' (append T tokens, then every query reads the state) or 'prefill' (causal
    attention over T tokens from the state: token i reads the state after its own append).
    k [B, H, T, D], v [B, H, T, Dv], key_mask [B, T] (nonzero = the token takes part), the
    map as favor::attention's (weights [sets, m, D], bias and lam [sets, m], decay float64
    [1] or [H]). Kernels: CPU the C++ decoder on a view of the state (no copy), CUDA the
    fused Triton step (T = 1), every other device plain torch operations (this default,
    generic.py)."""
    return torch_decode(sums, log_max, row_positions, position, q, k, v, key_mask, w, kernel,
                        scale, fit_a, fit_basis, weights, bias, lam, decay, step_kind)


def torch_decode(sums, log_max, row_positions, position, q, k, v, key_mask, w, kernel, scale,
                 fit_a, fit_basis, weights, bias, lam, decay, step_kind):
    """The default kernel: plain torch operations, the result written into the state."""
    y, new = _generic(sums, log_max, row_positions, position, q, k, v, key_mask, w, kernel,
                      scale, fit_a, fit_basis, weights, bias, lam, decay, step_kind)
    _write((sums, log_max, row_positions, position), new)
    return y


_BUILT = {}  # the C++ decoders the CPU kernels built last: key -> (map tensors, decoder)
_BUILT_MAX = 16


def built_decoder(make, scalars, tensors):
    """make() (a favor._core decoder of the op's map), or the one made for the same map
    before: a dispatched call (a compiled step, favor.ops.decode_step) then does not rebuild
    the C++ map every token. The map is the key by value: its scalars, and tensors compared
    with torch.equal against copies kept at the build (a freed tensor's memory reused holds
    other values)."""
    key = (scalars, tuple(None if t is None else (tuple(t.shape), t.dtype, t.device.type)
                          for t in tensors))
    hit = _BUILT.get(key)
    if hit is not None and all(a is None or torch.equal(a, b) for a, b in zip(hit[0], tensors)):
        return hit[1]
    dec = make()
    if len(_BUILT) >= _BUILT_MAX:
        _BUILT.pop(next(iter(_BUILT)))
    _BUILT[key] = ([None if t is None else t.detach().clone() for t in tensors], dec)
    return dec


@decode_step_op.register_kernel("cpu")
def cpu_decode(sums, log_max, row_positions, position, q, k, v, key_mask, w, kernel, scale,
               fit_a, fit_basis, weights, bias, lam, decay, step_kind):
    """The C++ decoder (map only, built once per map: built_decoder) stepping the state's
    memory in place."""
    b, h, _, dv = v.shape
    dec = built_decoder(
        lambda: _decoder(b, h, dv, w, kernel, scale, fit_a, fit_basis, weights, bias, lam, decay),
        ("decode", b, h, dv, kernel, scale), (w, fit_a, fit_basis, weights, bias, lam, decay))
    return cpu_step(dec, (sums, log_max, row_positions, position), q, k, v, key_mask, step_kind,
                    decay is not None)


def cpu_step(dec, state, q, k, v, key_mask, step_kind, decay=False):
    """The CPU kernel with the C++ decoder of the map given (an owner keeps one: built once,
    not per call)."""
    return borrowed_step(dec, state, q, k, v, key_mask, step_kind)


def borrowed_step(dec, state, q, k, v, key_mask, step_kind):
    """dec.step_state (a favor._core.Decoder or VQDecoder) on the memory of the state's
    tensors, advanced in place (a non-contiguous one through a contiguous copy, written
    back): the CPU kernels of favor::decode_step and favor::vq_decode_step."""
    T.follow_torch_threads()
    work = [t if t.is_contiguous() else t.contiguous() for t in state]
    keep = None if key_mask is None else T.array(key_mask.to(torch.bool))
    y = dec.step_state(*(t.numpy() for t in work), T.view(q.float()), T.view(k.float()),
                       T.view(v.float()), key_mask=keep, mode=step_kind)
    for t, x in zip(state, work):
        if t is not x:
            t.copy_(x)
    return T.tensor(y)


def triton_decode(sums, log_max, row_positions, position, q, k, v, key_mask, w, kernel, scale,
                  fit_a, fit_basis, weights, bias, lam, decay, step_kind):
    """CUDA's kernel: the fused Triton step for one token (else the default)."""
    from ..attention.triton_function import supported, triton_decode_step
    if step_kind != "step" or q.shape[2] != 1 or not _dispatch.triton_ready() \
            or not supported(q.shape[-1], v.shape[-1]):
        return torch_decode(sums, log_max, row_positions, position, q, k, v, key_mask, w, kernel,
                            scale, fit_a, fit_basis, weights, bias, lam, decay, step_kind)
    paths.check_inputs(q, k, v, False)
    cm = paths.device_map(q, w, weights, bias, lam, decay, fit_a, fit_basis, kernel, scale,
                          decay is not None)
    check_key_mask(key_mask, q.shape[0], k.shape[2])
    state = (sums, log_max, row_positions, position)
    y, new = triton_decode_step(state, q.float(), k.float(), v.float(), cm, key_mask)
    _write(state, new)
    return y


decode_step_op.register_kernel("cuda")(triton_decode)
_dispatch.register("decode_step", {"cpu": cpu_decode, "torch": torch_decode,
                                   "triton": triton_decode})


@decode_step_op.register_fake
def _(sums, log_max, row_positions, position, q, k, v, key_mask, w, kernel, scale, fit_a,
      fit_basis, weights, bias, lam, decay, step_kind):
    return q.new_empty((*q.shape[:-1], v.shape[-1]), dtype=torch.float32)


def empty_state(batch, heads, dv, features, device=None):
    """The DecodeState of a decoder with nothing appended, on device (None: the default
    device); features = F (favor._core.feature_count(kernel, m))."""
    return DecodeState(torch.zeros(batch, heads, features, dv + 1, device=device),
                       torch.full((batch, heads), float("-inf"), dtype=torch.float64,
                                  device=device),
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
    """One decoder step on tensors, functional: (y, new DecodeState) for state a DecodeState
    (or the 4-tuple; empty_state() to start), which is left as it was. q/k/v [B, H, T, D or
    Dv] (float32 or cast to it): T = 1 is one step of every row (fused on the CPU); T > 1
    appends the T tokens, then every query reads the state. projection a float [m, D]
    tensor, fit None or (a, basis) float64 tensors (FAVOR++ / FAVOR#), key_mask [B, T]
    (nonzero = the token takes part; left padding). A learned map as favor.torch.attention's:
    weights [sets, m, D], bias [sets, m], feature_weights [sets, m] (sets 1, H or B*H), decay
    a tensor of gamma per head ([1] or [H]). No autograd. The kernel is torch's dispatcher's
    choice by q's device (CPU: the C++ decoder; CUDA: the fused Triton step; others: torch
    operations), on one state layout, so a state moves between devices with .to(); backend
    forces one (ops/_dispatch.py)."""
    new = DecodeState(*(t.clone() for t in state)) if isinstance(state, (tuple, list)) \
        and len(state) == 4 and all(isinstance(t, torch.Tensor) for t in state) else state
    mode = "step" if q.shape[2] == 1 and k.shape[2] == 1 else "append_query"
    return advance(new, q, k, v, projection, mode=mode, kernel=kernel, scale=scale, fit=fit,
                   key_mask=key_mask, weights=weights, bias=bias,
                   feature_weights=feature_weights, decay=decay, backend=backend), new


def advance(state, q, k, v, projection, *, mode="step", kernel="positive", scale=None,
            fit=None, key_mask=None, weights=None, bias=None, feature_weights=None, decay=None,
            backend=None, decoder=None):
    """favor::decode_step on a DecodeState that is advanced in place (its owner keeps the
    same tensors: a Hugging Face cache layer, favor.torch.Decoder); returns y [B, H, T, Dv]
    float32. mode 'step', 'append_query' or 'prefill' (causal attention over the T tokens
    from the state, leaving the state after their append: the keys are featurised once),
    'append' (k, v; y empty) or 'query' (q). decoder: the favor._core.Decoder of this map,
    kept by an owner: eager CPU calls then run its kernel without the op's dispatch (the same
    kernel, the same bits; tens of us per call, which is most of a decode step's time)."""
    for t, name in ((q, "q"), (k, "k"), (v, "v"), (projection, "projection")):
        T.check_tensor(t, name)
    key_mask = _step_checks(q, k, v, key_mask, mode)
    forced = _dispatch.forced("decode_step", backend, q)
    if decoder is not None and isinstance(state, tuple) and eager_mode() \
            and _dispatch.cpu_kernel_runs(backend, q, k, v, *state[:4]):
        # no op dispatch; the C++ call checks the state's layout against the decoder's
        return cpu_step(decoder, state[:4], q, k, v, key_mask, mode, decay is not None)
    check_projection(projection, q)
    if not torch.compiler.is_compiling():
        _check_state(state, q.shape[0], q.shape[1],
                     _core.feature_count(kernel, projection.shape[0]), v.shape[-1])
        if state[0].device != q.device:
            raise _core.Error(f"state: on device '{state[0].device}', q on '{q.device}'; move "
                              "the state with .to(device) (DecodeState(*(t.to(d) for t in "
                              "state)))")
    args = (*tuple(state)[:4], q.float(), k.float(), v.float(),
            *op_map_args(q, key_mask, projection, kernel, scale, fit, weights, bias,
                         feature_weights, decay), mode)
    with torch.no_grad():
        return (decode_step_op if forced is None else forced)(*args)


def check_projection(projection, q):
    """A decoder op's projection: [m, D] for q's head dim D."""
    if projection.dim() != 2 or projection.shape[1] != q.shape[-1]:
        raise _core.Error(f"projection: shape {list(projection.shape)} must be [m, "
                          f"{q.shape[-1]}] (D = {q.shape[-1]})")


def op_map_args(q, key_mask, projection, kernel, scale, fit, weights, bias, feature_weights,
                decay):
    """The key mask and the map as the decoder ops take them, on q's device: (key_mask, w,
    kernel, scale, fit_a, fit_basis, weights, bias, lam, decay), detached, float32 (decay
    float64 [1] or [H]; a [m] lambda as one set, as in favor.attention)."""
    fit_a, fit_basis = (None, None) if fit is None else fit
    lam = _map_parameter(feature_weights, "feature_weights")
    if lam is not None and lam.dim() == 1:
        lam = lam[None]
    to = lambda t: None if t is None else t.to(q.device)  # noqa: E731
    decay_t = None if decay is None else _map_parameter(decay, "decay").reshape(-1)
    return (to(key_mask), to(projection.detach().float()), kernel,
            _args.optional_number(scale, "scale"), to(fit_a), to(fit_basis),
            to(_map_parameter(weights, "weights")), to(_map_parameter(bias, "bias")), to(lam),
            to(decay_t))


def _step_checks(q, k, v, key_mask, mode):
    """What every kernel refuses alike, before any state is read: the mode, q, k, v of rank
    4 ([B, H, T, D]), one token for 'step', a key mask as a tensor [B, T] (a list is
    taken). Returns the key mask as a tensor."""
    if mode not in MODES:
        raise _core.Error(f"mode: '{mode}' must be one of {', '.join(MODES)}")
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        if t.dim() != 4:
            raise _core.Error(f"{name}: shape {list(t.shape)} must be [B, H, T, D]")
    if mode == "step" and (q.shape[2] != 1 or k.shape[2] != 1):
        raise _core.Error(f"q {list(q.shape)}, k {list(k.shape)}: a step takes one token per "
                          "row (T = 1); use mode 'prefill' or 'append_query' for more")
    if key_mask is not None and not isinstance(key_mask, torch.Tensor):
        key_mask = torch.as_tensor(key_mask)
    return key_mask


_STATE_DTYPES = (torch.float32, torch.float64, torch.int64, torch.int64)


def _check_state(state, batch, heads, features, dv):
    """The layout of a state against the step's B, H, F and Dv, by C++'s rule
    (favor::check_decoder_state_layout; its values are checked where they are loaded)."""
    if not isinstance(state, (tuple, list)) or len(state) != 4 or not all(
            isinstance(t, torch.Tensor) for t in state):
        raise _core.Error("state: must be a DecodeState (sums, log_max, row_positions, "
                          "position tensors), as empty_state() or decode_step returns it")
    _core.check_decoder_state_layout(*(list(t.shape) for t in state), batch, heads, features,
                                     dv)
    for t, dtype, name in zip(state, _STATE_DTYPES, ("sums", "log_max", "row_positions",
                                                     "position")):
        if t.dtype != dtype:
            raise _core.Error(f"state.{name}: dtype {t.dtype} must be {dtype} (the state's "
                              "layout; empty_state() makes it)")
        if t.device != state[0].device:
            raise _core.Error(f"state.{name}: on device '{t.device}', state.sums on "
                              f"'{state[0].device}'; a state lives on one device")


def check_step_inputs(q, k, v, key_mask, step_kind):
    """A decoder op's inputs by C++'s rules (shapes, finite values) as the mode uses them
    ('append': k and v; 'query': q; otherwise all three), and its key mask [B, T]."""
    if step_kind == "append":  # q carries no token
        paths.check_inputs(k, k, v, False)
    elif step_kind == "query":  # k and v carry no token
        paths.check_inputs(q, q, q, False)
    else:
        paths.check_inputs(q, k, v, False)
    check_key_mask(key_mask, q.shape[0], k.shape[2])


def check_key_mask(key_mask, batch, tokens):
    """A decoder step's key_mask: None or [B, T] (C++'s rule and message,
    favor::check_key_mask_shape)."""
    if key_mask is None:
        return
    if not isinstance(key_mask, torch.Tensor):
        raise _core.Error(f"key_mask: expected a tensor [B, T] = [{batch},{tokens}], got "
                          f"{type(key_mask).__name__}")
    _core.check_key_mask_shape(list(key_mask.shape), batch, tokens, "T")
