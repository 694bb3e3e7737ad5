"""favor.hf.kl: distillation's loss with the language-model head fused in, for the whole
teacher distribution or the teacher's top k tokens and the mass of the rest (docs/hf.md,
"Distillation at scale").

    total = linear_kl(hidden, head.weight, Full(t_logp), temperature=1.0, weights=mask)
    total = linear_kl(hidden, head.weight, TopK(index, logp, rest), weights=mask)

Both return sum_t w_t KL_t T^2 over the positions t (the mean is the caller's division). The
student's logits s = hidden @ W^T are made chunk by chunk and never kept: the forward also
computes the gradient of each chunk (dL/ds = T (q - target), q = softmax(s / T)) and
multiplies it back through W at once, so the backward is a scale of gradients already made.
Two products with W per chunk, where autograd with checkpointing makes four.

TopK is what favor.hf.TeacherCache stores: the teacher's k most likely tokens, their log
probabilities, and rest = log(1 - sum of their probabilities). Its KL is the KL between the
two distributions coarsened to k + 1 outcomes (the k tokens and "any other"):

    KL_k = sum_{i in S} p_i log(p_i / q_i) + p_r log(p_r / q_r)

with q_r the student's mass outside S. It is never above the full KL, and falls short of it
by exactly p_r KL(p_tail || q_tail), the two tails' divergence (each renormalised to 1)
weighted by the teacher's tail mass; tail_bound() bounds that from what the cache holds
(every tail probability is at most the k-th largest, p_k) and the student's logits:

    0 <= KL - KL_k <= p_r (log(p_k / p_r) - min_{j not in S} log q_tail,j)^+

Its gradient moves the student's tail as a whole (target p_r q_j / q_r for j outside S).
"""
import torch

from .. import _core


class Full:
    """The whole teacher distribution: logp [n, V], log-probabilities at the temperature,
    or a callable (a, b) -> logp[a:b] that makes them chunk by chunk."""

    def __init__(self, logp):
        self.logp = logp

    def rows(self, a, b):
        return self.logp(a, b) if callable(self.logp) else self.logp[a:b]


class TopK:
    """The teacher's k most likely tokens per position: index [n, k] (int), logp [n, k]
    (their log-probabilities at the temperature) and rest [n] (the log of the mass of every
    other token; -inf when none is left)."""

    def __init__(self, index, logp, rest):
        self.index, self.logp, self.rest = index.long(), logp.float(), rest.float()

    def rows(self, a, b):
        return self.index[a:b], self.logp[a:b], self.rest[a:b]


def topk_of(logits, k, temperature=1.0):
    """(index [n, k], logp [n, k], rest [n]) of softmax(logits / T) over the last axis, in
    float32 (the TeacherCache's record of a teacher's logits)."""
    z = logits.float() / temperature
    lse = torch.logsumexp(z, -1, keepdim=True)
    k = min(k, z.shape[-1])
    values, index = z.topk(k, -1)
    logp = values - lse
    if k == z.shape[-1]:
        rest = torch.full(z.shape[:-1], -float("inf"))
    else:
        rest = torch.logsumexp(z.scatter(-1, index, -float("inf")), -1) - lse[..., 0]
    return index, logp, rest


def _kl_rows(z, target, rows):
    """(KL per row [c], dKL/dz [c, V]) of the student's scaled logits z (float32, consumed)
    against the target's rows."""
    if isinstance(target, Full):
        return _full_rows(z, target.rows(*rows).float())
    return _topk_rows(z, *target.rows(*rows))


def _full_rows(z, t_logp):
    logq = z - torch.logsumexp(z, -1, keepdim=True)
    q = logq.exp()
    p = t_logp.exp()
    kl = (p * (t_logp - logq)).sum(-1)
    return kl, q - p


def _topk_rows(z, index, a, rest):
    logq = z - torch.logsumexp(z, -1, keepdim=True)
    q = logq.exp()
    p_s, p_r = a.exp(), rest.exp()
    q_s = q.gather(-1, index)
    q_r = q.scatter(-1, index, 0.0).sum(-1)  # the student's mass outside S, a sum of positives
    tail = torch.where(p_r > 0, p_r * (rest - q_r.clamp_min(torch.finfo(q.dtype).tiny).log()),
                       torch.zeros_like(p_r))
    kl = (p_s * (a - logq.gather(-1, index))).sum(-1) + tail
    ratio = torch.where(q_r > 0, p_r / q_r, torch.zeros_like(q_r))
    g = q * (1.0 - ratio).unsqueeze(-1)
    return kl, g.scatter(-1, index, q_s - p_s)


_EAGER = (_full_rows, _topk_rows)


def compile_rows(on):
    """Runs the loss's elementwise part (after the head's product) through torch.compile
    (on) or eagerly (off): distill(compile=True)."""
    global _full_rows, _topk_rows
    if on:
        _full_rows, _topk_rows = (torch.compile(f, dynamic=True) for f in _EAGER)
    else:
        _full_rows, _topk_rows = _EAGER


class _LinearKL(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, target, temperature, weights, chunk, dtype):
        w = weight.detach().to(dtype)
        grad_h = torch.empty_like(hidden)
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) \
            if ctx.needs_input_grad[1] else None
        total = torch.zeros((), dtype=torch.float64, device=hidden.device)
        with torch.autocast(hidden.device.type, enabled=False):
            for a in range(0, hidden.shape[0], chunk):
                b = min(a + chunk, hidden.shape[0])
                h = hidden[a:b].detach().to(dtype)
                z = (h @ w.t()).float().div_(temperature)
                kl, g = _kl_rows(z, target, (a, b))
                wt = weights[a:b].to(torch.float32)
                total += (kl * wt).sum(dtype=torch.float64)
                g.mul_((wt * temperature).unsqueeze(-1))  # T^2 (q - p) / T, per real token
                grad_h[a:b] = (g.to(dtype) @ w).to(grad_h.dtype)
                if grad_w is not None:
                    grad_w.addmm_(g.t(), h.float())
        ctx.save_for_backward(grad_h, grad_w if grad_w is not None else torch.empty(0))
        ctx.weight_dtype = weight.dtype
        return (total * temperature ** 2).to(torch.float32)

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w = ctx.saved_tensors
        gh = grad_h * grad_out.to(grad_h.dtype)
        gw = (grad_w * grad_out).to(ctx.weight_dtype) if ctx.needs_input_grad[1] else None
        return gh, gw, None, None, None, None, None


def product_dtype(t):
    """The dtype the head's products run in: autocast's where it is on for t's device (bf16
    distillation), else t's own."""
    kind = t.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else t.dtype


def linear_kl(hidden, weight, target, temperature=1.0, weights=None, chunk=256):
    """sum_t w_t KL(teacher_t || softmax(hidden_t W^T / T)) T^2 (module docstring).
    hidden [..., D], weight [V, D] (the head; its gradient is made when it requires one): the
    products run in product_dtype(hidden) (under bf16 autocast, bfloat16), the softmax and
    the KL in float32. target: Full or TopK over the flattened positions, weights [...] (the
    attention mask; None: all 1)."""
    h = hidden.reshape(-1, hidden.shape[-1])
    w = torch.ones(h.shape[0], device=h.device) if weights is None else weights.reshape(-1)
    if w.shape[0] != h.shape[0]:
        raise _core.Error(f"weights: {tuple(weights.shape)} does not match the hidden states' "
                          f"positions {tuple(hidden.shape[:-1])}")
    return _LinearKL.apply(h, weight, target, float(temperature), w, int(chunk),
                           product_dtype(hidden))


def tail_bound(logits, target, temperature=1.0):
    """[n]: the most the full KL can exceed TopK's, per position (module docstring), from
    the student's logits [n, V] and the TopK target (its smallest kept log-probability is
    log p_k)."""
    index, a, rest = target.rows(0, logits.shape[0])
    z = logits.float() / temperature
    tail = z.scatter(-1, index, float("inf"))
    log_tail_min = tail.min(-1).values - torch.logsumexp(z.scatter(-1, index, -float("inf")), -1)
    bound = rest.exp() * (a.min(-1).values - rest - log_tail_min)
    return torch.where(rest > -float("inf"), bound.clamp_min(0.0), torch.zeros_like(bound))
