"""What favor's torch ops share: checks, and zero-copy conversion between
CPU tensors and the numpy views the C++ kernels read."""
import functools

import numpy as np
import torch

from .. import _core, _threads
from .._args import argument_named

FLOAT_TYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


from ._dispatch import BACKENDS, check_backend, check_device, triton_ready  # noqa: F401


def check_tensor(t, name):
    """Raises favor.Error (a ValueError) for what favor's ops cannot take: non-tensors,
    sparse or nested layouts, non-float dtypes (any device: torch's dispatcher picks the kernel)."""
    if not isinstance(t, torch.Tensor):
        raise _core.Error(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    check_device(t, name)
    if t.layout != torch.strided or getattr(t, "is_nested", False):
        raise _core.Error(f"{name}: layout {t.layout} is not supported; favor.torch takes dense "
                          "(strided) tensors")
    if t.dtype not in FLOAT_TYPES:
        raise _core.Error(f"{name}: dtype {t.dtype} is not a float type; favor.torch takes "
                          "float32 (used in place) or float64/float16/bfloat16 (computed in "
                          "float32)")


def as_float32(t, name):
    """t itself when float32 (autograd sees no op), else a differentiable cast."""
    check_tensor(t, name)
    return t if t.dtype == torch.float32 else t.to(torch.float32)


def view(t):
    """The numpy view of a float32 CPU tensor: no copy, strides kept."""
    return t.detach().numpy() if t.requires_grad else t.numpy()


def tensor(a):
    """A torch tensor sharing the memory of a numpy array favor returned."""
    return torch.from_numpy(a)


def names_key_padding_mask(function):
    """function (a favor.torch function taking torch's key_padding_mask) with the errors of
    the mask rules naming key_padding_mask. The rules are C++'s (the bindings') and the
    generic paths' copy of them, which name the mask key_mask: its name in C++ and in the
    numpy API, where the torch functions pass it on as favor's keep mask."""
    @functools.wraps(function)
    def named(*args, **kwargs):
        with argument_named("key_padding_mask", "key_mask"):
            return function(*args, **kwargs)
    return named


def check_mask(m, name="key_padding_mask"):
    """The checks of a key_padding_mask that need no values (safe while tracing): a bool or
    float tensor, or None."""
    if m is None:
        return None
    if not isinstance(m, torch.Tensor):
        raise _core.Error(f"{name}: expected a torch.Tensor, got {type(m).__name__}")
    if m.dtype != torch.bool and not m.is_floating_point():
        raise _core.Error(f"{name}: dtype {m.dtype} must be bool (True = ignore) or float "
                          "(0 / -inf)")
    return m


def keep_mask(key_padding_mask, name="key_padding_mask"):
    """torch's key_padding_mask (bool True = ignore this key; or float, 0 = attend and
    -inf = ignore) as favor's key mask (nonzero = the key takes part), a numpy bool array.
    Reads the values: called inside the ops, where tensors hold data."""
    keep = checked_keep(key_padding_mask, name)
    return None if keep is None else keep.detach().cpu().numpy()


def checked_keep(key_padding_mask, name="key_padding_mask"):
    """keep_tensor after the rule on a float mask's values (only 0 and -inf), which reads
    them: eager calls only (skipped while torch.compile traces)."""
    m = check_mask(key_padding_mask, name)
    if m is None:
        return None
    if m.dtype != torch.bool and not torch.compiler.is_compiling():
        if not bool(torch.all(torch.isneginf(m) | (m == 0))):
            raise _core.Error(f"{name}: a float mask must hold only 0 (attend) and -inf "
                              "(ignore); favor cannot add other biases to the scores")
    return keep_tensor(m, name)


def keep_tensor(key_padding_mask, name="key_padding_mask"):
    """keep_mask as a bool tensor computed by torch operations (safe while tracing, reads no
    values): True = the key takes part. A float mask's values (only 0 and -inf) are checked
    by checked_keep."""
    m = check_mask(key_padding_mask, name)
    if m is None:
        return None
    return ~m if m.dtype == torch.bool else ~torch.isneginf(m)


def array(t):
    """A C-contiguous numpy float array of an optional tensor (None stays None)."""
    return None if t is None else np.ascontiguousarray(t.detach().numpy())


def empty(dtype=torch.float32):
    """The placeholder an op returns for an output it did not compute (custom ops return
    tensors, never None)."""
    return torch.empty(0, dtype=dtype)


def follow_torch_threads():
    """favor uses torch.get_num_threads() threads unless favor.set_num_threads was called
    or FAVOR_NUM_THREADS is set: the two libraries then never oversubscribe the cores."""
    _threads.follow(torch.get_num_threads())


def projection_matrix(w, d):
    """A favor.Projection from a float [m, d] tensor on any device (a detached host copy:
    gradients flow through the autograd function, not through this copy)."""
    check_tensor(w, "projection")
    if w.dim() != 2 or w.shape[1] != d:
        raise _core.Error(f"projection: tensor of shape {list(w.shape)} must be [m, {d}] (D = {d})")
    return _core.Projection.from_matrix(
        np.ascontiguousarray(view(w.detach().to("cpu", torch.float32))))


def check_finite(t, name):
    """The C++ rule for inputs on any device (src/core/validate.cpp check_finite, its
    message): every element finite. One reduction and a host read (skipped while compiling:
    a traced graph cannot read values)."""
    if torch.compiler.is_compiling():
        return
    bad = ~torch.isfinite(t.detach())
    if not bool(bad.any()):
        return
    index = [int(i) for i in bad.nonzero()[0]]
    if len(index) == 2:
        index = [0, 0, *index]
    value = float(t.detach()[tuple(index[-t.dim():])])
    raise _core.Error(f"{name}: element [{','.join(map(str, index))}] is {value:g}; inputs "
                      "must be finite (no NaN or Inf)")


def check_same_device(reference, tensors):
    """favor's inputs share one device: (tensor, name) pairs against reference (q)."""
    for t, name in tensors:
        if t is not None and t.device != reference.device:
            raise _core.Error(f"{name}: tensor on device '{t.device}', q on "
                              f"'{reference.device}'; move every input to one device")
