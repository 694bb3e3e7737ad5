"""The one place where a caller's backend= picks a kernel instead of torch's dispatcher.

Every favor op is one torch.library registration with a kernel per device (docs/gpu.md,
"Kernels and devices"): the C++ kernel for CPU tensors, the fused Triton kernel for CUDA
tensors where one exists, and plain torch operations (ops/<op>/generic.py) as the default for
every other device. With backend=None (the default) torch's dispatcher picks by the tensors'
device and nothing here runs. backend='cpu' | 'torch' | 'triton' forces one kernel, for tests
and debugging: the op's table of kernels (KERNELS below, filled by each op's module) gives
the function, run under the op's own autograd formula where the op has one
(forced_autograd).
"""
import importlib.util
import os

import torch

from .. import _core

BACKENDS = ("cpu", "torch", "triton")

# op name -> {backend: kernel}: the kernels an op registers, by the name backend= uses.
KERNELS = {}


def triton_ready():
    """True when the fused Triton kernels can run: triton imports and either a CUDA device
    is present or TRITON_INTERPRET=1 (Triton's interpreter, which runs them on CPU tensors:
    how CI tests them)."""
    if importlib.util.find_spec("triton") is None:
        return False
    return torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


def check_backend(requested):
    """requested itself when None or one of BACKENDS, else favor.Error naming them."""
    if requested is not None and requested not in BACKENDS:
        raise _core.Error(f"backend: '{requested}' is not a backend; use one of "
                          f"{', '.join(BACKENDS)} (or None: chosen by the tensors' device)")
    return requested


def check_device(t, name):
    """favor.Error for devices no kernel takes: MPS (no float64, which favor's stabilisers
    and decoder maxima use) and meta (no data)."""
    dev = t.device.type
    if dev == "mps":
        raise _core.Error(f"{name}: tensor on device '{t.device}'; favor's paths keep per-key "
                          "offsets and decoder maxima in float64, which MPS lacks: use "
                          "CPU (or CUDA) tensors")
    if dev == "meta":
        raise _core.Error(f"{name}: tensor on device 'meta' holds no data; favor computes on "
                          "tensors with data (CPU, CUDA, any other device through the torch "
                          "path); for shapes alone use torch.compile's fake tensors")


def cpu_kernel_runs(requested, *tensors):
    """True when an op's CPU kernel computes: backend None or 'cpu' and every tensor given on
    the CPU. Callers that hold what the CPU kernel needs ready-made (a drawn projection, a
    decoder's map) call it then without the op's dispatch: the same kernel, the same bits."""
    return requested in (None, "cpu") and all(t is None or t.is_cpu for t in tensors)


def register(op_name, kernels):
    """Records an op's kernels by backend name ('cpu', 'torch', 'triton'; each a function of
    the op's arguments) for forced()."""
    KERNELS[op_name] = dict(kernels)


def forced(op_name, requested, t, name="q"):
    """The kernel of op_name that backend=requested forces, after the rules: 'cpu' takes CPU
    tensors, 'triton' CUDA tensors (or CPU tensors under TRITON_INTERPRET=1), 'torch' any
    device. None when requested is None (the dispatcher picks). An op without a Triton kernel
    takes 'triton' as 'torch' on CUDA tensors, as its CUDA registration does."""
    check_backend(requested)
    check_device(t, name)
    if requested is None:
        return None
    dev = t.device.type
    if requested == "cpu" and dev != "cpu":
        raise _core.Error(f"backend: 'cpu' runs the C++ kernels on CPU tensors; {name} is on "
                          f"'{t.device}' (use backend='torch' or None)")
    if requested == "triton":
        if not triton_ready():
            raise _core.Error("backend: 'triton' needs the triton package and a CUDA device "
                              "(or TRITON_INTERPRET=1 for its interpreter)")
        if dev not in ("cuda", "cpu") or (dev == "cpu"
                                         and os.environ.get("TRITON_INTERPRET") != "1"):
            raise _core.Error(f"backend: 'triton' runs on CUDA tensors; {name} is on "
                              f"'{t.device}' (CPU tensors only under TRITON_INTERPRET=1)")
    kernels = KERNELS[op_name]
    return kernels.get(requested, kernels["torch"])


class ForcedAutograd(torch.autograd.Function):
    """An op's autograd formula (its setup_context and backward) around forced kernels: the
    forward kernel computes the op's outputs, the backward formula calls the forced backward
    kernel where the op's would call its backward op. Used by forced() calls of ops with a
    gradient; the formula is the op's own (one per op)."""

    @staticmethod
    def forward(ctx, formula, forward_kernel, backward_kernel, *inputs):
        out = forward_kernel(*inputs)
        formula.setup_context(ctx, inputs, out)
        ctx.formula, ctx.backward_kernel = formula, backward_kernel
        outs = out if isinstance(out, tuple) else (out,)
        ctx.mark_non_differentiable(*outs[1:])
        return out

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, None, *ctx.formula.backward(
            ctx, *grads, backward_op=ctx.backward_kernel, need=ctx.needs_input_grad[3:]))


# Devices without a kernel of their own for the ops that keep one on the host (codebook
# learning, the sequence-parallel ops' MPI exchange): on_host runs them there.
OTHER_DEVICES = ("cuda", "xpu", "mps")


def on_host(op, name, mutated=()):
    """A kernel for a device without favor's C++ kernels: the op itself on host copies of
    the tensors (its CPU kernel), then the mutated arguments (their names) copied back and
    the result (a tensor or a tuple of them) moved to the device of the first tensor
    argument."""
    names = [a.name for a in getattr(torch.ops.favor, name).default._schema.arguments]

    def kernel(*args):
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        host = [a.detach().cpu().clone() if isinstance(a, torch.Tensor) else a for a in args]
        out = op(*host)
        for arg_name, a, h in zip(names, args, host):
            if arg_name in mutated:
                a.copy_(h)
        if out is None:
            return None
        if isinstance(out, tuple):
            return tuple(o.to(device) for o in out)
        return out.to(device)
    return kernel
