"""favor's torch ops (favor/ops): torch.library.opcheck for every op, torch.compile with
fullgraph=True and torch.export of models using them, equal to eager; dtypes; the device
switch.

Tolerances: the compiled graphs call the same C++ kernels as eager, so with the aot_eager
backend (no code generation) forward and gradients are bit-identical and are compared
exactly. Inductor generates its own code for the linear layers around favor's op: their
float32 rounding differs from eager by at most a few units of float32's rounding (u = 2^-24)
times the reduction length and the magnitudes summed (docs/numerics.md's bound for a
float32 dot product: |err| <= n u sum |a_i b_i|); the attention op itself then propagates
that difference with a gain of order 1 for these well-conditioned inputs. The bound used is
4 n u max|x| max|w| n-terms, computed from the tensors.
"""
import copy
import sys

import pytest
import torch

import favor
import favor.torch as ft
from conftest import opcheck_tolerance
from favor.ops.attention.op import attention_backward_op, attention_op
from favor.ops.codebook import (codebook_ema_update_op, codebook_initialise_op,
                                codebook_track_usage_op, vq_assign_op)
from favor.ops.exact.op import exact_attention_backward_op, exact_attention_op
from favor.ops.projection import projection_op
from favor.ops.vq.op import vq_attention_backward_op, vq_attention_op

U = 2.0 ** -24


def randn(*shape, seed=0, dtype=torch.float32, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(*shape, generator=g, dtype=dtype)
    return t.requires_grad_(requires_grad)


def qkv(b=2, h=2, n=12, d=8, dv=8, requires_grad=True, seed=0):
    return ((randn(b, h, n, d, seed=seed) * 0.5).requires_grad_(requires_grad),
            (randn(b, h, n, d, seed=seed + 1) * 0.5).requires_grad_(requires_grad),
            randn(b, h, n, dv, seed=seed + 2, requires_grad=requires_grad))


W = favor.make_projection(8, "orthogonal", features=16, seed=3)


def w_tensor(requires_grad=False):
    return torch.from_numpy(W.matrix.copy()).requires_grad_(requires_grad)


# ---- opcheck: schema, autograd registration, fake tensors, AOT dispatch (dynamic shapes) ----

def attention_args(kernel="positive", causal=False, save=True, mask=False, learned=False,
                   decay=False, fit=False):
    q, k, v = qkv()
    weights = bias = lam = gamma = None
    if learned:
        weights = randn(2, 16, 8, seed=7, requires_grad=True) * 0.3
        bias = randn(2, 16, seed=8, requires_grad=True) * 0.1
        lam = (1 + 0.1 * randn(2, 16, seed=9)).requires_grad_(True)
    if decay:
        gamma = torch.tensor([0.9, 0.8], dtype=torch.float64, requires_grad=True)
    kpm = None
    if mask:
        kpm = torch.zeros(2, 12, dtype=torch.bool)
        kpm[0, -3:] = True
    fit_a = fit_basis = None
    if fit:
        fit_a = torch.full((1, 8), -0.05, dtype=torch.float64)
        fit_basis = torch.eye(8, dtype=torch.float64)[None]
    return (q, k, v, w_tensor(True), weights, bias, lam, gamma, kpm, fit_a, fit_basis, kernel,
            causal, None, save and not causal, "f32")


ATTENTION_CASES = {
    "positive": dict(),
    "trig": dict(kernel="trig"),
    "hyperbolic": dict(kernel="hyperbolic"),
    "favorpp_fit": dict(kernel="favorpp", fit=True),
    "favorpp_selffit": dict(kernel="favorpp"),
    "favorsharp": dict(kernel="favorsharp"),
    "causal": dict(causal=True),
    "masked": dict(mask=True),
    "hedgehog_learned": dict(kernel="hedgehog", learned=True),
    "learned_decay": dict(learned=True, decay=True, causal=True),
    "no_context": dict(save=False),
}


# N = 12 tokens, m = 8 projections: F <= 16 features (trig, hyperbolic).
OPCHECK_TOL = opcheck_tolerance(12, 16)


@pytest.mark.parametrize("case", list(ATTENTION_CASES))
def test_opcheck_attention(case):
    torch.library.opcheck(attention_op, attention_args(**ATTENTION_CASES[case]), **OPCHECK_TOL)


@pytest.mark.parametrize("case", ["positive", "causal", "causal_saved", "hedgehog_learned",
                                  "learned_decay"])
def test_opcheck_attention_backward(case):
    """causal_saved: a causal forward saving its chunk states, and its rows apart (the op's
    fifth output), which the backward reads in place."""
    saved_causal = case == "causal_saved"
    args = attention_args(**ATTENTION_CASES["causal" if saved_causal else case])
    if saved_causal:
        args = (*args[:14], True, *args[15:])
    y, states, maxima, fp, rows = (t.detach() for t in attention_op(*args))
    assert int(fp[0]) == 1 or not saved_causal
    assert rows.numel() == (12 * 9 * 4 if saved_causal else 0)  # [B*H][N][Dv + 1]
    dy = randn(*y.shape, seed=11)
    detached = [a.detach() if isinstance(a, torch.Tensor) else a for a in args[:11]]
    torch.library.opcheck(attention_backward_op,
                          (dy, *detached, y, states, maxima, fp, *args[11:14], True, 0, 0, rows),
                          **OPCHECK_TOL)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask", [False, True])
def test_opcheck_exact(causal, mask):
    q, k, v = qkv()
    kpm = None
    if mask:
        kpm = torch.zeros(2, 12)
        kpm[1, :2] = float("-inf")
    torch.library.opcheck(exact_attention_op, (q, k, v, kpm, causal, 0.3))
    dy = randn(2, 2, 12, 8, seed=5)
    torch.library.opcheck(exact_attention_backward_op,
                          (dy, q.detach(), k.detach(), v.detach(), kpm, causal, 0.3))
    # windowed, saving its context (lse, fingerprint), and the backward from it
    windowed = (q, k, v, kpm, causal, 0.3, 3, 1, True)
    torch.library.opcheck(exact_attention_op, windowed)
    y, lse, fp = exact_attention_op(*(a.detach() if isinstance(a, torch.Tensor) else a
                                      for a in windowed))
    assert int(fp[0]) == 1 and lse.shape == q.shape[:-1] and lse.dtype == torch.float64
    torch.library.opcheck(exact_attention_backward_op,
                          (dy, q.detach(), k.detach(), v.detach(), kpm, causal, 0.3, 3, 1, y, lse,
                           fp))


@pytest.mark.parametrize("tau", [0.0, 0.5])
@pytest.mark.parametrize("causal", [False, True])
def test_opcheck_vq(tau, causal):
    q, k, v = qkv()
    codebook = randn(2, 5, 8, seed=4, requires_grad=True)
    torch.library.opcheck(vq_attention_op, (q, k, v, codebook, None, causal, None, tau, 4))
    dy = randn(2, 2, 12, 8, seed=6)
    torch.library.opcheck(vq_attention_backward_op,
                          (dy, q.detach(), k.detach(), v.detach(), codebook.detach(), None,
                           causal, None, tau, 4, True))


def test_opcheck_projection():
    torch.library.opcheck(projection_op, ("orthogonal", 16, 8, "chi", 3))
    assert torch.equal(projection_op("orthogonal", 16, 8, "chi", 3), w_tensor())


def codebook_state(h=2, c=5, d=8, seed=4):
    """(codebook, ema_sum, ema_count, unused) as VQCore holds them after k-means."""
    book = randn(h, c, d, seed=seed)
    book[:, -1] += 1e3  # code c-1 of every head: no key chooses it, ...
    unused = torch.zeros(h, c, dtype=torch.int64)
    unused[:, -1] = 2  # ... nor did for 2 batches so far
    return book, book.clone(), torch.ones(h, c), unused


def padding(kind, b=2, n=12):
    """None, or a key_padding_mask ignoring the last 3 keys of the first sequence (bool
    True, or float -inf)."""
    if kind is None:
        return None
    pad = torch.zeros(b, n, dtype=torch.bool)
    pad[0, -3:] = True
    return pad if kind == "bool" else torch.zeros(b, n).masked_fill(pad, float("-inf"))


def test_opcheck_vq_assign():
    _, k, _ = qkv(requires_grad=False)
    book = codebook_state()[0]
    torch.library.opcheck(vq_assign_op, (k, book))
    z = vq_assign_op(k, book)
    want = favor.reference.vq_assign(k.numpy(), book.numpy())
    assert z.dtype == torch.int64 and torch.equal(z, torch.from_numpy(want).long())


@pytest.mark.parametrize("mask", [None, "bool", "float"])
@pytest.mark.parametrize("keys", [12, 2])  # 2 x 2 = 4 keys < 5 codes: topped up
@pytest.mark.parametrize("initialised", [False, True])
def test_opcheck_codebook_initialise(mask, keys, initialised):
    _, k, _ = qkv(n=keys, requires_grad=False)
    state = [torch.zeros(2, 5, 8), torch.zeros(2, 5, 8), torch.zeros(2, 5),
             torch.ones(2, 5, dtype=torch.int64), torch.tensor(initialised)]
    args = (k, padding(mask, n=keys), *state, 25, 3, False)
    torch.library.opcheck(codebook_initialise_op, args)
    codebook_initialise_op(*args)
    assert bool(state[4])
    if initialised:  # nothing done
        assert not state[0].any() and not state[2].any() and state[3].all()
        return
    assert torch.equal(state[0], state[1]) and state[0].abs().sum() > 0
    assert torch.equal(state[2], torch.ones(2, 5)) and not state[3].any()
    if keys == 12 and mask is None:  # favor.Codebook.kmeans on the keys of each head
        rows = k.permute(1, 0, 2, 3).reshape(1, 2, -1, 8).contiguous().numpy()
        want = favor.Codebook.kmeans(rows, 5, iterations=25, seed=3).values
        assert torch.equal(state[0], torch.from_numpy(want.copy()))


@pytest.mark.parametrize("mask", [None, "bool", "float"])
@pytest.mark.parametrize("dead_after", [0, 2])
def test_opcheck_codebook_ema_update(mask, dead_after):
    _, k, _ = qkv(requires_grad=False)
    state = codebook_state()
    args = (*state, k, padding(mask), torch.tensor(3), 0.9, dead_after, 7)
    torch.library.opcheck(codebook_ema_update_op, args)
    # The same step as favor.Codebook's EMA update through _core (seed mix_seed(7, 3)).
    want = [t.clone() for t in state]
    keep = None if mask is None else favor.ops._tensors.keep_mask(padding(mask))
    reset = favor._core.codebook_ema_update(*[t.numpy() for t in want], k.numpy(), decay=0.9,
                                            dead_after=dead_after,
                                            seed=favor._args.mix_seed(7, 3), key_mask=keep)
    got = codebook_ema_update_op(*args)
    assert got.dtype == torch.int64 and int(got) == reset
    assert (reset > 0) == (dead_after > 0)  # code 4 reached dead_after = 2
    for a, b in zip(state, want):
        assert torch.equal(a, b)


@pytest.mark.parametrize("mask", [None, "bool", "float"])
@pytest.mark.parametrize("dead_after", [0, 2])
def test_opcheck_codebook_track_usage(mask, dead_after):
    _, k, _ = qkv(requires_grad=False)
    book, _, _, unused = codebook_state()
    z = vq_assign_op(k, book)
    args = (book, unused, k, z, padding(mask), torch.tensor(3), dead_after, 7)
    torch.library.opcheck(codebook_track_usage_op, args)
    before = book.clone()
    moved = codebook_track_usage_op(*args)
    assert moved.dtype == torch.int64 and unused[:, -1].tolist() == [0 if dead_after else 3] * 2
    assert int(moved) == (2 if dead_after else 0)
    if dead_after:  # the last code of each head now sits on one of its head's unmasked keys
        for head in range(2):
            rows = k[:, head].reshape(-1, 8)
            if mask is not None:
                rows = rows[favor.ops._tensors.keep_tensor(padding(mask)).reshape(-1)]
            assert (rows == book[head, -1]).all(-1).any()
    assert torch.equal(book[:, :-1], before[:, :-1])


# ---- the ops equal the C++ calls they wrap ----

@pytest.mark.parametrize("case", list(ATTENTION_CASES))
def test_attention_op_gradients_equal_the_numpy_api(case):
    """Forward and every gradient of the op (through autograd) equal favor.attention and
    favor.attention_backward on the same float32 values, bit for bit (same C++ calls)."""
    spec = ATTENTION_CASES[case]
    args = attention_args(**spec)
    q, k, v, w = args[:4]
    y = attention_op(*args)[0]
    dy = randn(*y.shape, seed=11)
    y.backward(dy)
    if spec.get("learned") or spec.get("decay"):
        return  # the map path: compared against the numpy API in test_torch_gradients.py
    proj = favor._core.Projection.from_matrix(w.detach().numpy())
    fit = None
    if spec.get("fit"):
        fit = favor.KernelFit(args[9].numpy(), args[10].numpy())
    keep = None if args[8] is None else (~args[8]).numpy()
    opts = dict(kernel=args[11], causal=args[12], key_mask=keep, fit=fit)
    y_ref = favor._core.attention(q.detach().numpy(), k.detach().numpy(), v.detach().numpy(),
                                  proj, **opts)[0]
    assert torch.equal(y.detach(), torch.from_numpy(y_ref))
    g = favor._core.attention_backward(q.detach().numpy(), k.detach().numpy(),
                                       v.detach().numpy(), dy.numpy(), proj,
                                       projection_grad=True, **opts)
    for t, ref in zip((q, k, v, w), g):
        assert torch.equal(t.grad, torch.from_numpy(ref))


def test_bf16_precision_equals_the_numpy_api():
    """favor.torch.attention(precision='bf16') is favor.attention(precision='bf16') bit for
    bit (the same C++ call), forward, and its backward the float32 backward from the key
    state the bf16 forward saved."""
    q, k, v = qkv()
    w = w_tensor()
    y = ft.attention(q, k, v, projection=w, precision="bf16")
    arrays = [t.detach().numpy() for t in (q, k, v)]
    proj = favor._core.Projection.from_matrix(w.numpy())
    y_ref, _, ctx = favor._core.attention(*arrays, proj, precision="bf16", save_context=True)
    assert torch.equal(y.detach(), torch.from_numpy(y_ref))
    dy = randn(*y.shape, seed=11)
    y.backward(dy)
    g = favor._core.attention_backward(*arrays, dy.numpy(), proj, context=ctx)
    for t, ref in zip((q, k, v), g):
        assert torch.equal(t.grad, torch.from_numpy(ref))


# ---- torch.compile(fullgraph=True) and torch.export ----

def commitment_losses(model):
    """The commitment losses the VQ modules of model (or of the model compiled) set in their
    latest forward."""
    model = getattr(model, "_orig_mod", model)  # a compiled model forwards attributes to it
    return [m.commitment_loss for m in model.modules()
            if getattr(m, "commitment_loss", None) is not None]


def grads_of(model, x, dy):
    """(output, input grad, parameter grads, commitment losses) of one step; the loss is
    <output, dy> plus the commitment losses of VQ modules."""
    model.zero_grad()
    x = x.detach().requires_grad_(True)
    out = model(x)
    out = out[0] if isinstance(out, tuple) else out
    losses = commitment_losses(model)
    torch.autograd.backward([out, *losses], [dy, *(torch.ones_like(t) for t in losses)])
    return out.detach(), x.grad, [p.grad.clone() for p in model.parameters()
                                  if p.grad is not None], [t.detach() for t in losses]


class Wrapped(torch.nn.Module):
    """favor.torch.attention called functionally inside a model."""

    def __init__(self, **options):
        super().__init__()
        self.lin = torch.nn.Linear(16, 48)
        self.options = options

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.lin(x).view(b, n, 3, 2, 8).permute(2, 0, 3, 1, 4)
        return ft.attention(q, k, v, **self.options).transpose(1, 2).reshape(b, n, 16)


class MHASelf(torch.nn.Module):
    def __init__(self, module=ft.MultiheadAttention, is_causal=True, mask=None, **options):
        super().__init__()
        self.mha = module(16, 2, batch_first=True, **options)
        self.is_causal, self.mask = is_causal, mask

    def forward(self, x):
        pad = padding(self.mask, *x.shape[:2])
        return self.mha(x, x, x, key_padding_mask=pad, need_weights=False,
                        is_causal=self.is_causal)[0]


class Masked(torch.nn.Module):
    """A module called with padding(mask) as its key_padding_mask (built inside the graph)."""

    def __init__(self, attn, mask):
        super().__init__()
        self.attn, self.mask = attn, mask

    def forward(self, x):
        return self.attn(x, key_padding_mask=padding(self.mask, *x.shape[:2]))


# dead_after=1: a code no key of a batch chooses is re-seeded right after it (the reset path
# runs in the steps the tests take).
VQ = dict(codes=8, dead_after=1, seed=2)
VQ_MODELS = {
    "VQAttention": lambda: ft.VQAttention(16, 2, **VQ),
    "VQAttention_causal_grad": lambda: ft.VQAttention(16, 2, causal=True, learn_codebook="grad",
                                                      **VQ),
    "VQAttention_causal_masked": lambda: Masked(ft.VQAttention(16, 2, causal=True, **VQ),
                                                "bool"),
    "VQAttention_grad_soft_float_mask": lambda: Masked(
        ft.VQAttention(16, 2, tau=0.5, learn_codebook="grad", **VQ), "float"),
    "VQMultiheadAttention_causal": lambda: MHASelf(ft.VQMultiheadAttention, **VQ),
    "VQMultiheadAttention_grad_masked": lambda: MHASelf(
        ft.VQMultiheadAttention, is_causal=False, mask="bool", learn_codebook="grad", **VQ),
}


MODELS = {
    "FavorAttention": lambda: ft.FavorAttention(16, 2, features=16, seed=1),
    "FavorAttention_causal_favorpp": lambda: ft.FavorAttention(16, 2, features=16, causal=True,
                                                                kernel="favorpp", fit=-0.05),
    "FavorAttention_hedgehog": lambda: ft.FavorAttention(16, 2, features=16, kernel="hedgehog",
                                                         learn_features=True),
    "FavorAttention_decay": lambda: ft.FavorAttention(16, 2, features=16, causal=True,
                                                      feature_weights=True, decay=0.9,
                                                      learn_decay=True),
    "FavorAttention_exact": lambda: ft.FavorAttention(16, 2, method="exact", causal=True),
    "MultiheadAttention": lambda: MHASelf(features=16),
    "attention": lambda: Wrapped(features=16, causal=False),
    "attention_trig_causal": lambda: Wrapped(features=16, kernel="trig", causal=True),
    "attention_exact": lambda: Wrapped(method="exact"),
    **VQ_MODELS,
}


def compare_steps(name, training, steps):
    """The model and a deep copy, one run eagerly and the other compiled with
    fullgraph=True (no graph break) and the aot_eager backend (the traced graph run with
    eager kernels): for each step (a new batch) the output, the input and parameter
    gradients, the commitment losses and afterwards every buffer and parameter (VQ: the
    codebook, its EMA state, unused, initialised, updates, resets) are bit-identical.
    Returns the eager model."""
    torch.manual_seed(0)
    model = MODELS[name]().train(training)
    twin = copy.deepcopy(model)
    torch._dynamo.reset()
    compiled = torch.compile(twin, fullgraph=True, backend="aot_eager")
    for step in range(steps):
        x, dy = randn(2, 10, 16, seed=1 + 2 * step), randn(2, 10, 16, seed=2 + 2 * step)
        eager, got = grads_of(model, x, dy), grads_of(compiled, x, dy)
        assert torch.equal(eager[0], got[0]), step
        assert torch.equal(eager[1], got[1]), step
        assert len(eager[2]) == len(got[2]) > 0
        for a, b in zip(eager[2], got[2]):
            assert torch.equal(a, b), step
        assert len(eager[3]) == len(got[3])
        for a, b in zip(eager[3], got[3]):
            assert torch.equal(a, b), step
        state = {**dict(twin.named_buffers()), **dict(twin.named_parameters())}
        for key, value in [*model.named_buffers(), *model.named_parameters()]:
            assert torch.equal(value, state[key]), (step, key)  # a 'grad' codebook is a Parameter
    return model


@pytest.mark.parametrize("name", list(MODELS))
def test_compile_fullgraph_equals_eager(name):
    """Training mode, 3 steps: for VQ modules the first initialises the codebook by k-means
    and each one learns (EMA or gradient tracking, dead-code resets) inside the graph."""
    model = compare_steps(name, True, 3)
    vq = [m for m in model.modules() if hasattr(m, "codebook")]
    for m in vq:
        assert bool(m.initialised) and int(m.updates) == 3
    if name in ("VQAttention", "VQAttention_causal_grad"):
        # The reset path ran (measured: codes re-seeded in these 3 steps).
        assert sum(m.codes_reset for m in vq) > 0


@pytest.mark.parametrize("name", list(VQ_MODELS))
def test_compile_fullgraph_eval_equals_eager(name):
    """Eval mode: the first call initialises the codebook (in the graph), then no learning."""
    model = compare_steps(name, False, 2)
    for m in model.modules():
        if hasattr(m, "codebook"):
            assert bool(m.initialised) and int(m.updates) == 0


def test_compile_inductor_within_derived_bound():
    """The default backend (inductor, C++ code generation for the linear layers): forward
    and input gradient within the float32 dot-product bound of the layers around favor."""
    torch.manual_seed(0)
    model = ft.FavorAttention(16, 2, features=16, causal=True)
    x, dy = randn(2, 10, 16, seed=1), randn(2, 10, 16, seed=2)
    eager = grads_of(model, x, dy)
    torch._dynamo.reset()
    got = grads_of(torch.compile(model, fullgraph=True), x, dy)
    n = 16  # the reduction length of each linear layer
    wmax = max(float(p.detach().abs().max()) for p in model.parameters())
    scale = float(x.abs().max()) * wmax * n
    bound = 4 * n * U * scale * 4  # in projection, attention (gain ~1), out projection
    assert float((eager[0] - got[0]).abs().max()) <= bound * max(1.0, float(eager[0].abs().max()))
    gbound = 4 * n * U * float(dy.abs().max()) * wmax * n * 4
    assert float((eager[1] - got[1]).abs().max()) <= gbound * max(1.0, float(eager[1].abs().max()))


@pytest.mark.parametrize("name", ["FavorAttention", "FavorAttention_causal_favorpp",
                                  "MultiheadAttention", "attention", "VQAttention",
                                  "VQAttention_causal_masked",
                                  "VQAttention_grad_soft_float_mask",
                                  "VQMultiheadAttention_causal"])
def test_export_inference_model(name):
    """An eval-mode model (a VQ codebook initialised by one forward first) exports; the
    exported program gives the eager output bit for bit."""
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    x = randn(2, 10, 16, seed=1)
    with torch.no_grad():
        model(randn(2, 10, 16, seed=9))  # initialises a VQ codebook (k-means)
        want = model(x)
        want = want[0] if isinstance(want, tuple) else want
        exported = torch.export.export(model, (x,))
        got = exported.module()(x)
        got = got[0] if isinstance(got, tuple) else got
    assert torch.equal(want, got)
    targets = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    assert any(t.startswith("favor.") for t in targets), targets


# ---- dtypes, the device switch ----

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("method", ["favor", "exact"])
def test_other_dtypes_compute_in_float32(dtype, method):
    """bf16 / fp16 / f64 inputs: computed in float32 from the rounded inputs, returned in
    their dtype: equal to the float32 call on the same values, rounded once to dtype."""
    q, k, v = (t.detach().to(dtype).requires_grad_(True) for t in qkv())
    y = ft.attention(q, k, v, features=16, method=method)
    assert y.dtype == dtype
    q32, k32, v32 = (t.detach().float().requires_grad_(True) for t in (q, k, v))
    y32 = ft.attention(q32, k32, v32, features=16, method=method)
    assert torch.equal(y, y32.to(dtype))
    dy = randn(*y.shape, seed=3).to(dtype)
    y.backward(dy)
    y32.backward(dy.float())
    for t, t32 in ((q, q32), (k, k32), (v, v32)):
        assert t.grad.dtype == dtype
        assert torch.equal(t.grad, t32.grad.to(dtype))


def test_vq_bf16():
    q, k, v = (t.detach().to(torch.bfloat16) for t in qkv())
    codebook = randn(2, 5, 8, seed=4)
    y = ft.vq_attention(q, k, v, codebook, causal=True)
    assert y.dtype == torch.bfloat16
    want = ft.vq_attention(q.float(), k.float(), v.float(), codebook, causal=True)
    assert torch.equal(y, want.to(torch.bfloat16))


def test_device_switch_names_the_device():
    q, k, v = qkv(requires_grad=False)
    meta = q.to("meta")
    with pytest.raises(favor.Error, match=r"q: tensor on device 'meta' holds no data"):
        ft.attention(meta, k, v)
    with pytest.raises(favor.Error, match=r"k: tensor on device 'meta'"):
        ft.vq_attention(q, k.to("meta"), v, randn(5, 8))


def test_a_scale_or_tau_that_is_not_a_number_is_named():
    """float('x') would raise a ValueError naming nothing: the ops' plain values are converted
    as the bindings convert them, TypeError naming the argument."""
    q, k, v = qkv(requires_grad=False)
    with pytest.raises(TypeError, match=r"scale: 'x' \(str\) is not a number"):
        ft.attention(q, k, v, scale="x")
    with pytest.raises(TypeError, match=r"scale: \[1\] \(list\) is not a number"):
        ft.attention(q, k, v, method="exact", scale=[1])
    with pytest.raises(TypeError, match=r"tau: None \(NoneType\) is not a number"):
        ft.vq_attention(q, k, v, randn(5, 8), tau=None)


def test_mha_need_weights_rule():
    mha = ft.MultiheadAttention(16, 2, batch_first=True, features=16)
    x = randn(2, 5, 16)
    out, weights = mha(x, x, x)  # torch's default need_weights=True: nothing is read
    assert weights is None and out.shape == (2, 5, 16)
    with pytest.raises(favor.Error, match="need_weights: True asks for the L x S attention "
                                          "weights.*need_weights=False"):
        mha(x, x, x, need_weights=True)


def test_mha_is_causal_without_reading_the_mask():
    mha = ft.MultiheadAttention(16, 2, batch_first=True, features=16)
    x = randn(2, 5, 16)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(5)
    a = mha(x, x, x, need_weights=False, attn_mask=causal, is_causal=True)[0]
    b = mha(x, x, x, need_weights=False, is_causal=True)[0]
    assert torch.equal(a, b)
    with pytest.raises(favor.Error, match="attn_mask: a mask of shape \\[5, 5\\] without "
                                          "is_causal=True"):
        mha(x, x, x, need_weights=False, attn_mask=causal)


def test_plain_cpu_calls_without_grad_take_the_short_layer(monkeypatch):
    """favor.torch.attention on plain float32 CPU tensors without a gradient to record skips
    the general argument layer (as_float32, device checks): the same bits as the op, for
    masks (bool and float), a fit, 2-D inputs and strided views, and the same errors as the
    general path for bad input."""
    fa = sys.modules["favor.ops.attention"]  # the module (favor.ops.attention is the function)
    q, k, v = randn(2, 4, 7, 16, seed=1), randn(2, 4, 7, 16, seed=2), randn(2, 4, 7, 8, seed=3)
    w = projection_op("orthogonal", 64, 16, "chi", 0)
    bool_mask = torch.tensor([[False] * 6 + [True], [True, False] + [False] * 5])
    float_mask = torch.zeros(2, 7).masked_fill(bool_mask, float("-inf"))
    cases = [dict(), dict(causal=True), dict(key_padding_mask=bool_mask),
             dict(key_padding_mask=float_mask, causal=True), dict(scale=0.3),
             dict(kernel="favorpp", fit=-0.1)]
    expected = []
    for c in cases:
        fit_a, fit_basis = fa.fit_tensors(c.get("fit"), c.get("kernel", "positive"), 16, (2, 4))
        expected.append(attention_op(q, k, v, w, None, None, None, None,
                                     c.get("key_padding_mask"), fit_a, fit_basis,
                                     c.get("kernel", "positive"), c.get("causal", False),
                                     c.get("scale"), False, "f32")[0])
    qt = q.transpose(2, 3).contiguous().transpose(2, 3)  # same values, other strides
    assert qt.stride() != q.stride()

    def general_layer_called(*a, **kw):
        raise AssertionError("the general layer ran")

    with torch.no_grad(), monkeypatch.context() as mp:
        mp.setattr(fa.T, "as_float32", general_layer_called)
        for c, y in zip(cases, expected):
            assert torch.equal(ft.attention(q, k, v, features=64, **c), y), c
            assert torch.equal(ft.attention(qt, k, v, features=64, **c), y), c
        # A 2-D input is one head: the op's bits on that head alone. (Not those of the same
        # head inside a batch: the short path projects a group of heads with one GEMM, and a
        # BLAS kernel's result for a row may depend on the rows around it, as on AVX2.)
        one_head = attention_op(q[:1, :1], k[:1, :1], v[:1, :1], w, None, None, None, None,
                                None, None, None, "positive", False, None, False, "f32")[0]
        two_d = ft.attention(q[0, 0], k[0, 0], v[0, 0], features=64)
        assert torch.equal(two_d, one_head[0, 0])
    # A requires-grad input under no_grad takes the short layer too (nothing to record).
    with torch.no_grad():
        assert torch.equal(ft.attention(q.clone().requires_grad_(), k, v, features=64),
                           expected[0])

    def message(grad, **kw):
        args = dict(q=q, k=k, v=v)
        args.update({n: kw.pop(n) for n in ("q", "k", "v") if n in kw})
        if grad:
            args["q"] = args["q"].detach().clone().requires_grad_()
        with torch.set_grad_enabled(grad), pytest.raises(ValueError) as e:
            ft.attention(args["q"], args["k"], args["v"], **kw)
        return str(e.value)

    nan_q = q.clone()
    nan_q[0, 1, 2, 3] = float("nan")
    bad = [dict(q=torch.tensor(1.0), k=torch.tensor(1.0), v=torch.tensor(1.0)),
           dict(k=randn(2, 4, 7, 12)), dict(q=nan_q), dict(kernel="softmax"),
           dict(key_padding_mask=torch.zeros(2, 7, dtype=torch.int64)),
           dict(key_padding_mask=torch.zeros(2, 6, dtype=torch.bool)),
           dict(key_padding_mask=torch.full((2, 7), 1.0)), dict(features=0),
           dict(projection="nope"), dict(scale=float("nan")), dict(precision="f16")]
    for kw in bad:
        fast = message(False, **dict(kw))
        assert fast == message(True, **dict(kw)), kw
        assert fast.startswith(("q", "k", "key_padding_mask", "kernel", "features",
                                "projection", "scale", "precision")), fast


def test_eager_calls_without_grad_equal_the_op():
    """An eager CPU call with nothing to differentiate runs the C++ call without the op's
    dispatch (favor.ops.attention.op.eager): the same bits as favor::attention, for a drawn
    projection and a projection tensor. Grad mode and dispatch modes (profilers, FlopCounter)
    still go through the op, which such a mode sees."""
    from torch.utils._python_dispatch import TorchDispatchMode

    q, k, v = randn(2, 4, 5, 16, seed=1), randn(2, 4, 7, 16, seed=2), randn(2, 4, 7, 8, seed=3)
    w = projection_op("orthogonal", 64, 16, "chi", 0)
    op_y = attention_op(q, k, v, w, None, None, None, None, None, None, None, "positive",
                        False, None, False, "f32")[0]
    with torch.no_grad():
        assert torch.equal(ft.attention(q, k, v, features=64), op_y)
        assert torch.equal(ft.attention(q, k, v, projection=w), op_y)

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Seen() as seen:
        y = ft.attention(q, k, v, projection=w)
    assert torch.equal(y, op_y) and any("favor.attention" in o for o in seen.ops)
