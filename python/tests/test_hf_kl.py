"""favor.hf.kl (distillation's loss with the head fused in) and favor.hf.TeacherCache (the
teacher's top k on disk): the fused loss and its gradients against autograd of the dense
formula in float64, the top-k KL's identity (full KL = top-k KL + the tails' share) and its
stated bound, and the cache's format, reuse and refusals. Tiny random models: hf_models.py."""
import copy
import json
import os

import pytest
import torch

import favor
import favor.hf as fh
from favor.hf.distill import kl_loss
from favor.hf.kl import Full, TopK, linear_kl, tail_bound, topk_of
from hf_models import batches, make

V, D, N = 40, 12, 23


def _case(seed=0, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, D, generator=g, dtype=torch.float64)
    weight = torch.randn(V, D, generator=g, dtype=torch.float64) * scale / D ** 0.5
    t_logits = torch.randn(N, V, generator=g, dtype=torch.float64) * scale
    weights = (torch.rand(N, generator=g) > 0.2).double()
    return hidden, weight, t_logits, weights


def _dense_full(hidden, weight, t_logits, weights, temperature):
    s = hidden @ weight.t() / temperature
    t = t_logits / temperature
    kl = (t.softmax(-1) * (t.log_softmax(-1) - s.log_softmax(-1))).sum(-1)
    return (kl * weights).sum() * temperature ** 2


def _dense_topk(hidden, weight, t_logits, weights, temperature, k):
    """KL over k + 1 outcomes (the teacher's top k and the rest), float64, by hand."""
    s = (hidden @ weight.t() / temperature).log_softmax(-1)
    t = (t_logits / temperature).log_softmax(-1)
    index = t.topk(k, -1).indices
    inside = torch.zeros_like(t, dtype=torch.bool).scatter(-1, index, True)
    p_r = (t.exp() * ~inside).sum(-1)
    q_r = (s.exp() * ~inside).sum(-1)
    kl = (t.exp() * (t - s) * inside).sum(-1) + p_r * (p_r.log() - q_r.log())
    return (kl * weights).sum() * temperature ** 2


@pytest.mark.parametrize("temperature", [1.0, 2.0])
@pytest.mark.parametrize("chunk", [1, 7, 100])
def test_full_target_is_the_dense_kl_and_its_gradients(temperature, chunk):
    hidden, weight, t_logits, weights = _case(1)
    t_logp = (t_logits / temperature).log_softmax(-1)
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    got = linear_kl(h, w, Full(t_logp), temperature, weights, chunk)
    got.backward()
    h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    want = _dense_full(h2, w2, t_logits, weights, temperature)
    want.backward()
    assert float(want) > 1.0
    assert float(got) == pytest.approx(float(want), rel=1e-5)  # float32 KL sums
    assert torch.allclose(h.grad, h2.grad, rtol=1e-4, atol=1e-6)
    assert torch.allclose(w.grad, w2.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("k", [1, 5, 39])
@pytest.mark.parametrize("temperature", [1.0, 1.5])
def test_topk_target_is_the_coarsened_kl_and_its_gradients(k, temperature):
    hidden, weight, t_logits, weights = _case(2)
    target = TopK(*topk_of(t_logits, k, temperature))
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    got = linear_kl(h, w, target, temperature, weights, chunk=6)
    got.backward()
    h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    want = _dense_topk(h2, w2, t_logits, weights, temperature, k)
    want.backward()
    assert float(got) == pytest.approx(float(want), rel=1e-5)
    assert torch.allclose(h.grad, h2.grad, rtol=1e-4, atol=1e-6)
    assert torch.allclose(w.grad, w2.grad, rtol=1e-4, atol=1e-6)


def test_topk_of_the_whole_vocabulary_is_the_full_kl():
    hidden, weight, t_logits, weights = _case(3)
    index, logp, rest = topk_of(t_logits, V)
    assert torch.isinf(rest).all() and (rest < 0).all()
    got = linear_kl(hidden, weight, TopK(index, logp, rest), 1.0, weights)
    want = _dense_full(hidden, weight, t_logits, weights, 1.0)
    assert float(got) == pytest.approx(float(want), rel=1e-5)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("k", [1, 4, 16])
def test_the_full_kl_exceeds_the_topk_kl_by_the_tails_share_within_the_bound(seed, k):
    """KL = KL_k + p_r KL(p_tail || q_tail) per position (math in favor.hf.kl), so
    0 <= KL - KL_k <= tail_bound."""
    hidden, weight, t_logits, _ = _case(10 + seed, scale=3.0)
    ones = torch.ones(N, dtype=torch.float64)
    target = TopK(*topk_of(t_logits, k))
    s_logits = hidden @ weight.t()
    full = torch.stack([_dense_full(hidden[i:i + 1], weight, t_logits[i:i + 1], ones[:1], 1.0)
                        for i in range(N)])
    coarse = torch.stack([_dense_topk(hidden[i:i + 1], weight, t_logits[i:i + 1], ones[:1],
                                      1.0, k) for i in range(N)])
    # the tails' share, computed on its own
    t, s = t_logits.log_softmax(-1), s_logits.log_softmax(-1)
    outside = torch.ones_like(t, dtype=torch.bool).scatter(-1, target.index, False)
    p_r, q_r = (t.exp() * outside).sum(-1), (s.exp() * outside).sum(-1)
    pt = torch.where(outside, t - p_r.log().unsqueeze(-1), torch.zeros_like(t))
    qt = torch.where(outside, s - q_r.log().unsqueeze(-1), torch.zeros_like(s))
    share = p_r * (pt.exp() * (pt - qt) * outside).sum(-1)
    assert torch.allclose(full - coarse, share, atol=1e-10)
    gap = full - coarse
    bound = tail_bound(s_logits, target).double()
    assert (gap >= -1e-12).all()
    assert (gap <= bound + 1e-5).all()
    assert float(gap.sum()) > 0.01  # the cases have a tail worth bounding


def test_linear_kl_refuses_mismatched_weights():
    hidden, weight, t_logits, _ = _case()
    with pytest.raises(ValueError, match="weights"):
        linear_kl(hidden, weight, Full(t_logits.log_softmax(-1)), 1.0, torch.ones(N + 1))


def _batches(count=3, n=16):
    return batches(count, n, seed=40)


def test_the_cache_holds_the_teachers_topk_and_reads_it_back(tmp_path):
    teacher = make("llama")
    batches = _batches()
    cache = fh.TeacherCache(str(tmp_path / "c"), teacher, k=5, temperature=1.5)
    assert cache.fill(batches, progress=False) == 3 and len(cache) == 3
    assert cache.fill(batches, progress=False) == 0  # made once
    meta = json.loads((tmp_path / "c" / "teacher.json").read_text())
    assert meta["k"] == 5 and meta["temperature"] == 1.5 and meta["precision"] == "float32"
    assert meta["vocab"] == teacher.get_output_embeddings().weight.shape[0]
    with torch.no_grad():
        logits = teacher(**batches[1]).logits
    index, logp, rest = topk_of(logits.reshape(-1, logits.shape[-1]), 5, 1.5)
    again = fh.TeacherCache(str(tmp_path / "c"), k=5, temperature=1.5)  # read only
    got = again.get(batches[1])
    assert again.made == 0
    assert torch.equal(got.index, index) and torch.equal(got.logp, logp)
    assert torch.equal(got.rest, rest)
    names = sorted(os.listdir(tmp_path / "c"))
    assert names[-1] == "teacher.json" and all(n.endswith(".safetensors") for n in names[:-1])


def test_distilling_from_a_full_cache_is_distilling_from_the_teacher(tmp_path):
    """k = vocabulary: the cache's loss is the exact KL, and a run from it ends where a
    run from the live teacher ends."""
    teacher = make("llama")
    vocab = teacher.get_output_embeddings().weight.shape[0]
    batches = _batches()
    cache = fh.TeacherCache(str(tmp_path / "c"), teacher, k=vocab)
    ends = []
    for source in (teacher, cache):
        student = copy.deepcopy(teacher)
        fh.convert(student, "hedgehog", features=8, window=4, sinks=1)
        with torch.no_grad():
            before = float(kl_loss(student, source, batches[0]))
        report = fh.distill(student, source, batches, steps=4, lr=3e-3, progress=False,
                            precision="float32")
        ends.append((before, list(report), student.state_dict()))
    (b0, l0, s0), (b1, l1, s1) = ends
    assert b1 == pytest.approx(b0, rel=1e-5)
    assert l1 == pytest.approx(l0, rel=1e-4)
    assert all(torch.allclose(s0[k], s1[k], atol=1e-5) for k in s0)
    assert "cache k=" in str(report) and report.precision == "float32"


def test_a_topk_cache_loss_is_the_full_loss_less_at_most_the_bound(tmp_path):
    teacher = make("llama")
    student = copy.deepcopy(teacher)
    fh.convert(student, "hedgehog", features=8, window=4, sinks=1)
    batch = _batches(1)[0]
    cache = fh.TeacherCache(str(tmp_path / "c"), teacher, k=4)
    with torch.no_grad():
        full = float(kl_loss(student, teacher, batch))
        part = float(kl_loss(student, cache, batch))
        s_logits = student(**batch).logits
    target = cache.get(batch)
    bound = tail_bound(s_logits.reshape(-1, s_logits.shape[-1]), target)
    keep = batch["attention_mask"].reshape(-1).float()
    assert 0 <= full - part <= float((bound * keep).sum() / keep.sum()) + 1e-6
    assert part > 0.0


def test_the_cache_refuses_other_settings_another_teacher_and_missing_entries(tmp_path):
    teacher = make("llama")
    folder = str(tmp_path / "c")
    with pytest.raises(ValueError, match="teacher: .* holds no teacher cache"):
        fh.TeacherCache(folder)
    fh.TeacherCache(folder, teacher, k=4)
    with pytest.raises(ValueError, match="folder: .* holds a teacher cache with"):
        fh.TeacherCache(folder, teacher, k=8)
    with pytest.raises(ValueError, match="folder: .* holds a teacher cache with"):
        fh.TeacherCache(folder, teacher, k=4, precision="bf16")
    other = copy.deepcopy(teacher)
    with torch.no_grad():
        next(other.parameters()).add_(1.0)
    with pytest.raises(ValueError, match="teacher: its weights are not those"):
        fh.TeacherCache(folder, other, k=4)
    read_only = fh.TeacherCache(folder, k=4)
    with pytest.raises(ValueError, match="batches: a batch has no entry"):
        read_only.get(_batches(1)[0])
    for bad, match in ((dict(k=0), "k: 0"), (dict(temperature=0), "temperature: 0"),
                       (dict(precision="f16"), "precision: 'f16'")):
        with pytest.raises(ValueError, match=match):
            fh.TeacherCache(str(tmp_path / "d"), teacher, **bad)
    student = copy.deepcopy(teacher)
    fh.convert(student, "hedgehog", features=8, window=4, sinks=1)
    with pytest.raises(ValueError, match="temperature: 2.0, but the cache was made at 1.0"):
        fh.distill(student, fh.TeacherCache(folder, k=4), _batches(1), steps=1,
                   temperature=2.0, progress=False)


@pytest.mark.skipif(not favor.bf16_available(), reason="no bf16 here: nothing to tell apart")
def test_a_float32_cache_made_during_a_bf16_run_holds_the_float32_teacher(tmp_path):
    teacher = make("llama")
    student = copy.deepcopy(teacher)
    fh.convert(student, "hedgehog", features=8, window=4, sinks=1)
    batches = _batches(2)
    cache = fh.TeacherCache(str(tmp_path / "c"), teacher, k=6)
    fh.distill(student, cache, batches, steps=2, precision="bf16", progress=False)
    assert cache.made == 2
    for b in batches:
        with torch.no_grad():
            logits = teacher(**b).logits
        index, logp, rest = topk_of(logits.reshape(-1, logits.shape[-1]), 6)
        got = fh.TeacherCache(str(tmp_path / "c"), k=6).get(b)
        assert torch.equal(got.index, index) and torch.equal(got.logp, logp)
