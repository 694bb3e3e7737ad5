"""favor.hf on tiny random models of every family (hf_models.py): exact equals the
original; every method runs forward and backward; generate() through favor's decoder state
equals the full forward (greedy, sampling, beam search, left padding) with a state that
does not grow; save/load; refusals. Attention transfer and fine-tuning: test_hf_transfer.py.

Tolerances: exact attention in float32 against the family's own (sdpa) attention: the two
sum the same terms in another order, so rtol 1e-5 plus atol 2e-5 of logits of size ~10.
Decoding through the state against the chunked causal kernel: the same estimator summed in
another order, atol 1e-4.
"""
import copy
import logging
import warnings

import numpy as np
import pytest
import torch
import transformers as tf

import favor
import favor.hf as fh
from hf_models import (DECODERS, FAMILIES, generates_as_full_forward, inputs, make, positions,
                       run)

METHOD_CASES = {
    "exact": ("exact", {}),
    "favor": ("favor", dict(features=32)),
    "favor_trig_iid": ("favor", dict(kernel="trig", projection="iid", features=32)),
    "favor_qmc": ("favor", dict(projection="qmc", features=32)),
    "favor++": ("favor++", dict(features=32)),
    "favor#": ("favor#", dict(features=32)),
    "dijiang": ("dijiang", dict(features=32)),
    "hedgehog": ("hedgehog", dict(features=16)),
    "positive-fit": ("positive-fit", dict(features=32)),
    "decay": ("favor", dict(features=32, decay=0.95)),
    "learned_decay": ("hedgehog", dict(features=16, decay=[0.9, 0.95, 0.97, 0.99],
                                       learn_decay=True)),
    "vq": ("vq", dict(codes=8)),
}


def converted(family, method="favor", **options):
    """A tiny model converted to `method`; FAVOR++ / FAVOR# get their fit from a transfer
    (a causal layer refuses to fit the sequence it attends: that would see the future)."""
    m = make(family)
    fh.convert(m, method, **options)
    if method in ("favor++", "favor#"):
        ids, mask = inputs(seed=7, left=family != "bert")
        fh.transfer(m, [dict(input_ids=ids, attention_mask=mask)], progress=False)
    return m


@pytest.mark.parametrize("family", FAMILIES)
def test_exact_equals_the_original(family):
    original = make(family)
    ids, mask = inputs(left=family != "bert")
    ref = run(original, ids, mask)
    model = copy.deepcopy(original)
    report = fh.convert(model, "exact")
    assert len(report) == 2 and report.method == "exact"
    assert all(r.causal == (family != "bert") for r in report)
    got = run(model, ids, mask)
    keep = mask.bool()
    torch.testing.assert_close(got[keep], ref[keep], rtol=1e-5, atol=2e-5)
    assert model.config._attn_implementation == "favor"


@pytest.mark.parametrize("family", ["llama", "bert"])
@pytest.mark.parametrize("case", sorted(METHOD_CASES))
def test_every_method_runs_forward_and_backward(family, case):
    method, options = METHOD_CASES[case]
    if family == "bert" and "decay" in options:  # test_decay_on_a_bidirectional_model_...
        with pytest.raises(favor.Error, match="^decay: .* causal attention only"):
            converted(family, method, **options)
        return
    model = converted(family, method, **options)
    model.train()
    ids, mask = inputs(left=family != "bert")
    out = run(model, ids, mask)
    assert torch.isfinite(out).all()
    out[mask.bool()].square().mean().backward()
    first = next(p for n, p in model.named_parameters() if "favor_core" not in n and
                 n.endswith(("q_proj.weight", "query.weight")))
    assert first.grad is not None and torch.isfinite(first.grad).all() and first.grad.abs().sum() > 0
    for _, _, core in fh.cores(model):
        for name, p in core.named_parameters():
            if p.requires_grad and name != "codebook":
                assert p.grad is not None and torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize("family", DECODERS)
@pytest.mark.parametrize("case", ["favor", "hedgehog", "decay", "favor#", "vq"])
def test_greedy_generation_through_the_state_equals_the_full_forward(family, case):
    method, options = METHOD_CASES[case]
    model = converted(family, method, **options)
    ids, mask = inputs()
    generates_as_full_forward(model, ids, mask, 6)


def test_generate_uses_a_favor_cache_of_fixed_size():
    model = converted("llama", "favor", features=32)
    ids, mask = inputs()
    sizes = []
    for new in (2, 12):
        cache = fh.FavorCache()
        model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False,
                       cache=cache)
        assert cache.get_seq_length() == ids.shape[1] + new - 1
        sizes.append(cache.state_bytes)
    assert sizes[0] == sizes[1] > 0
    # generate() makes its own cache (a DynamicCache, no transformers method patched): every
    # layer becomes favor's at the prompt, and the tokens equal those of a FavorCache
    out = model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                         return_dict_in_generate=True)
    made = out.past_key_values if getattr(out, "past_key_values", None) is not None \
        else out.cache
    assert isinstance(made, tf.DynamicCache)
    assert len(made.layers) == model.config.num_hidden_layers
    assert all(isinstance(layer, fh.FavorCacheLayer) for layer in made.layers)
    assert sum(layer.state_bytes for layer in made.layers) == sizes[1]
    mine = model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                          cache=fh.FavorCache())
    assert torch.equal(out.sequences, mine)


@pytest.mark.parametrize("method", ["favor", "hedgehog"])
def test_the_torch_path_of_gpus_generates_as_the_cpp_path(method):
    """backend='torch' (the path of CUDA without triton and of other devices, docs/gpu.md):
    the converted model's logits and its FavorCache generation (state held as tensors, beam
    reorders included) equal the C++ path's."""
    ids, mask = inputs()
    models = [converted("llama", method, features=16, **kw) for kw in ({}, {"backend": "torch"})]
    models[1].load_state_dict(models[0].state_dict())
    logits = [run(m, ids, mask) for m in models]
    torch.testing.assert_close(logits[1], logits[0], rtol=0, atol=1e-5)
    outs = [m.generate(ids, attention_mask=mask, max_new_tokens=5, num_beams=2,
                       do_sample=False) for m in models]
    assert torch.equal(outs[0], outs[1])
    assert all(c[-1].backend == "torch" for c in fh.cores(models[1]))


@pytest.mark.parametrize("family,method", [("llama", "hedgehog"), ("gpt2", "hedgehog"),
                                           ("llama", "favor++"), ("gpt2", "favor#")])
def test_beam_search_and_sampling_equal_recomputing_the_whole_sequence(family, method):
    """Beam search reorders the decoding state (FAVOR++ / FAVOR#: a fit per head, which
    follows any reorder) and sampling steps it: both equal recomputing the whole sequence
    at every step (use_cache=False)."""
    model = converted(family, method, features=16)
    ids, mask = inputs()
    beam = model.generate(ids, attention_mask=mask, max_new_tokens=6, num_beams=3,
                          do_sample=False)
    beam_ref = model.generate(ids, attention_mask=mask, max_new_tokens=6, num_beams=3,
                              do_sample=False, use_cache=False)
    assert torch.equal(beam, beam_ref)
    torch.manual_seed(5)
    sample = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=True)
    torch.manual_seed(5)
    sample_ref = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=True,
                                use_cache=False)
    assert torch.equal(sample, sample_ref)


def test_exact_method_generates_with_the_key_value_cache_like_the_original():
    original = make("qwen2")
    model = copy.deepcopy(original)
    fh.convert(model, "exact")
    ids, mask = inputs()
    assert torch.equal(model.generate(ids, attention_mask=mask, max_new_tokens=5,
                                      do_sample=False),
                       original.generate(ids, attention_mask=mask, max_new_tokens=5,
                                         do_sample=False))


@pytest.mark.parametrize("case", ["hedgehog", "favor#", "vq", "learned_decay"])
def test_save_pretrained_and_from_pretrained_round_trip(tmp_path, case):
    method, options = METHOD_CASES[case]
    model = converted("llama", method, **options)
    ids, mask = inputs()
    if method == "vq":
        fh.transfer(model, [dict(input_ids=ids, attention_mask=mask)], progress=False)
    with torch.no_grad():
        for _, _, core in fh.cores(model):  # trained-looking maps, not the initial ones
            for p in core.parameters():
                p.add_(0.01 * torch.randn_like(p))
    ref = run(model, ids, mask)
    fh.save_pretrained(model, tmp_path)
    loaded = fh.from_pretrained(tmp_path)
    assert type(loaded) is type(model) and loaded.config.favor["method"] == method
    torch.testing.assert_close(run(loaded, ids, mask), ref, rtol=0, atol=0)


@pytest.mark.parametrize("family,method", [("llama", "favor++"), ("gpt2", "favor#")])
def test_plain_save_pretrained_keeps_the_fits(tmp_path, family, method):
    """model.save_pretrained alone (no favor call) keeps the conversion in config.json and
    the FAVOR++ / FAVOR# fits in the weights file (fit_a, fit_basis of every core): no
    favor_fits.safetensors; from_pretrained rebuilds the model without fitting again, its
    outputs the saved model's bit for bit."""
    import json
    from safetensors.torch import load_file
    model = converted(family, method, features=32)
    ids, mask = inputs(left=True)
    ref = run(model, ids, mask)
    model.save_pretrained(tmp_path)
    assert not (tmp_path / "favor_fits.safetensors").exists()
    assert json.loads((tmp_path / "config.json").read_text())["favor"] == {
        "method": method, "features": 32}
    saved = load_file(tmp_path / "model.safetensors")
    for layer, _, core in fh.cores(model):
        a = [v for k, v in saved.items() if k.endswith(".favor_core.fit_a")][layer]
        assert a.dtype == torch.float64 and torch.equal(a, core.fit_a)
    loaded = fh.from_pretrained(tmp_path)
    assert fh.FavorConfig.of(loaded) == fh.FavorConfig(method, dict(features=32))
    for (_, _, c0), (_, _, c1) in zip(fh.cores(model), fh.cores(loaded)):
        assert np.array_equal(np.asarray(c1.fit.basis), np.asarray(c0.fit.basis))
    torch.testing.assert_close(run(loaded, ids, mask), ref, rtol=0, atol=0)


def test_a_checkpoint_with_favor_fits_safetensors_still_loads(tmp_path):
    """The layout of an earlier favor.hf.save_pretrained: the fits apart, in
    favor_fits.safetensors ({layer}.a, {layer}.basis), not in the weights."""
    from safetensors.torch import load_file, save_file
    model = converted("llama", "favor++", features=32)
    ids, mask = inputs(left=True)
    ref = run(model, ids, mask)
    model.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    tensors = {k: v for k, v in load_file(weights).items() if ".fit_" not in k}
    save_file(tensors, weights, metadata={"format": "pt"})
    fits = {}
    for layer, _, core in fh.cores(model):
        fits[f"{layer}.a"], fits[f"{layer}.basis"] = core.fit_a, core.fit_basis
    save_file(fits, tmp_path / "favor_fits.safetensors")
    loaded = fh.from_pretrained(tmp_path)
    torch.testing.assert_close(run(loaded, ids, mask), ref, rtol=0, atol=0)


def test_a_favor_core_keeps_its_fit_in_its_state_dict():
    """FavorCore's fit is the float64 buffers fit_a, fit_basis: a state_dict carries it to
    a core without one, .to(device) moves it, a dtype cast leaves it float64."""
    model = converted("llama", "favor#", features=32)
    core = fh.cores(model)[0][2]
    state = core.state_dict()
    assert state["fit_a"].dtype == state["fit_basis"].dtype == torch.float64
    fresh = fh.Method.build(fh.METHODS["favor#"], dict(features=32), core.num_heads,
                            core.head_dim, True, core.scale, 0, "cpu")
    assert fresh.fit is None and "fit_a" not in fresh.state_dict()
    fresh.load_state_dict(state)
    assert torch.equal(fresh.fit_basis, core.fit_basis)
    assert np.array_equal(np.asarray(fresh.fit.a), state["fit_a"].numpy())
    fresh.to(torch.bfloat16)
    assert fresh.fit_a.dtype == torch.float64 and torch.equal(fresh.fit_a, core.fit_a)
    core.fit = None
    assert "fit_a" not in core.state_dict() and core.fit_tensors is None


def test_the_registries_hold_one_record_per_family_and_method():
    assert set(fh.FAMILIES) == {"bert", "gpt2", "llama", "mistral", "qwen2", "gpt_neox"}
    assert set(fh.METHODS) == {"exact", "favor", "favor++", "favor#", "dijiang", "hedgehog",
                               "positive-fit", "vq", "window"}
    assert [m for m, r in fh.METHODS.items() if r.needs_fit] == ["favor++", "favor#"]
    assert fh.METHODS["exact"].state is None and fh.METHODS["vq"].fits == "codebook"
    for kind, family in fh.FAMILIES.items():
        model = make(kind)
        modules = family.attention_modules(model)
        assert family.kind == ("encoder" if kind == "bert" else "decoder")
        targets = family.lora_targets(model)  # every projection exists, attention only
        assert len(targets) == len(modules) * len(family.projections)
        names = dict(model.named_modules())
        assert all(t in names for t in targets)
    gpt2 = make("gpt2")
    assert not any(".mlp." in t for t in fh.FAMILIES["gpt2"].lora_targets(gpt2))
    spec = fh.FavorConfig("favor", dict(features=8, decay=torch.tensor([0.5]), backend="torch"))
    assert spec.to_dict() == {"method": "favor", "features": 8, "decay": [0.5]}
    assert fh.FavorConfig.from_dict(spec.to_dict()) == spec
    with pytest.raises(favor.Error, match="codes: not an option of method favor"):
        fh.FavorConfig.from_dict({"method": "favor", "codes": 3})
    with pytest.raises(favor.Error, match="projection: method dijiang uses projection='dct'"):
        fh.FavorConfig("dijiang", dict(projection="iid"))
    with pytest.raises(favor.Error, match="kernel: hedgehog is a method of its own"):
        fh.FavorConfig("favor", dict(kernel="hedgehog"))


def test_from_pretrained_of_a_plain_model_is_refused(tmp_path):
    make("llama").save_pretrained(tmp_path)
    with pytest.raises(favor.Error, match="no favor model"):
        fh.from_pretrained(tmp_path)


def test_from_pretrained_of_a_missing_directory_names_the_path(tmp_path):
    missing = str(tmp_path / "no" / "such" / "dir")
    with pytest.raises(favor.Error, match=f"^path: '{missing}' does not exist"):
        fh.from_pretrained(missing)
    a_file = tmp_path / "model.safetensors"
    a_file.write_bytes(b"")
    with pytest.raises(favor.Error, match=f"^path: '{a_file}' is not a directory"):
        fh.from_pretrained(str(a_file))


def test_from_pretrained_reports_only_the_tensors_that_do_not_fit(tmp_path, caplog):
    """transformers' load report (a logged warning) leaves out favor's tensors, which
    from_pretrained loads after converting, and still lists a tensor nothing loads."""
    from safetensors.torch import load_file, save_file
    fh.save_pretrained(converted("llama", "hedgehog", features=16), tmp_path)
    with caplog.at_level(logging.WARNING, logger="transformers"):
        with pytest.warns(UserWarning, match="favor checkpoint"):
            tf.LlamaForCausalLM.from_pretrained(tmp_path)  # the report reaches caplog
        assert "favor_core" in caplog.text
        caplog.clear()
        fh.from_pretrained(tmp_path)
        assert "favor_core" not in caplog.text and "UNEXPECTED" not in caplog.text
        weights = tmp_path / "model.safetensors"
        tensors = load_file(weights)
        tensors["model.layers.0.self_attn.stray"] = torch.zeros(2)
        save_file(tensors, weights, metadata={"format": "pt"})
        fh.from_pretrained(tmp_path)
    rows = [line for line in caplog.text.splitlines() if "| UNEXPECTED" in line]
    assert rows and all("stray" in line for line in rows), rows


@pytest.mark.parametrize("family", FAMILIES)
def test_a_favor_checkpoint_loaded_by_transformers_alone_warns(tmp_path, family):
    """transformers' own from_pretrained of a favor checkpoint gives the softmax model (it
    knows nothing of favor_core): with favor.hf imported, it warns, naming the way to load
    it; favor.hf.from_pretrained does not."""
    model = make(family)
    fh.convert(model, "favor", features=16)
    model.save_pretrained(tmp_path)
    auto = tf.AutoModel if family == "bert" else tf.AutoModelForCausalLM
    for load in (type(model).from_pretrained, auto.from_pretrained):
        with pytest.warns(UserWarning, match=r"is a favor checkpoint .* runs softmax attention"
                                             r".* favor\.hf\.from_pretrained\("):
            plain = load(tmp_path)
        assert type(plain) is type(model)
        with pytest.raises(favor.Error, match="not converted"):
            fh.cores(plain)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = fh.from_pretrained(tmp_path)
    assert not [w for w in caught if "favor checkpoint" in str(w.message)]
    assert len(fh.cores(loaded)) == 2


def test_refusals_name_what_favor_cannot_serve():
    with pytest.raises(favor.Error, match="method: 'softmax' is not a favor.hf method"):
        fh.convert(make("llama"), "softmax")
    with pytest.raises(favor.Error, match="codes: not an option of method favor"):
        fh.convert(make("llama"), "favor", codes=3)
    with pytest.raises(favor.Error, match="not a family favor.hf converts"):
        fh.convert(torch.nn.Linear(2, 2))
    with pytest.raises(favor.Error, match="cross-attention"):
        fh.convert(make("bert", is_decoder=True, add_cross_attention=True))
    model = converted("llama")
    ids, mask = inputs()
    with pytest.raises(favor.Error, match="output_attentions"):
        model(ids, attention_mask=mask, output_attentions=True)
    bias = torch.zeros(2, 1, ids.shape[1], ids.shape[1])
    with pytest.raises(favor.Error, match="2D padding mask"):
        model(ids, attention_mask=bias)
    packed = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4]] * 2)
    with pytest.raises(favor.Error, match="cannot honour"):
        model(ids, position_ids=packed, use_cache=False)
    windowed = make("mistral", sliding_window=8)
    fh.convert(windowed)
    with pytest.raises(favor.Error, match="sliding_window: 10 keys outrun"):
        windowed(ids)
    with pytest.raises(favor.Error, match="not converted"):
        fh.cores(make("gpt2"))
    fh.convert(model, "exact")  # a FavorCache keeps an exact layer's keys and values
    cache = fh.FavorCache()
    torch.testing.assert_close(model(ids, attention_mask=mask, cache=cache).logits,
                               model(ids, attention_mask=mask).logits, rtol=0, atol=0)
    assert cache.layers[0].keys.shape[-2] == ids.shape[1]


def test_decay_on_a_bidirectional_model_is_refused():
    """decay weighs causal attention only; an encoder's layers are bidirectional on every
    call, so the decay would do nothing: refused before any layer is converted (vq's decay,
    its codebook's moving average, is not attention decay)."""
    model = make("bert")
    for options in (dict(decay=0.9), dict(decay=[0.9] * 4, learn_decay=True)):
        with pytest.raises(favor.Error, match=r"^decay: gamma\^\(i - j\) weighs causal "
                                              "attention only.* bidirectional"):
            fh.convert(model, "hedgehog", features=16, **options)
    with pytest.raises(favor.Error, match="not converted"):
        fh.cores(model)
    fh.convert(model, "vq", codes=8, decay=0.9)
    with pytest.raises(favor.Error, match=r"^projection: 'bogus' is not a projection"):
        fh.convert(make("bert"), "favor", projection="bogus")


@pytest.mark.parametrize("family", FAMILIES)
def test_packed_position_ids_are_refused(family):
    """Position ids that restart inside a row pack several sequences into it; favor attends
    the row as one sequence, so it refuses them, with or without a mask or a cache. Padded
    tokens' positions are not compared (left padding: test_greedy_generation...)."""
    model = make(family)
    fh.convert(model, "favor", features=16)
    ids, mask = inputs(left=family != "bert")
    packed = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4]] * 2)
    message = r"^position_ids: row 0 goes from 4 to 0 at token 5: .* packed sequences"
    calls = [dict(attention_mask=torch.ones_like(ids)), dict(attention_mask=mask)]
    if family != "bert":
        calls.append(dict(cache=fh.FavorCache()))
    for kw in calls:
        with pytest.raises(favor.Error, match=message):
            model(ids, position_ids=packed, **kw)
    model(ids, position_ids=torch.arange(3, 13).expand(2, -1))  # an offset is no restart
    if family != "bert":
        model(ids, attention_mask=mask, position_ids=positions(mask))  # left padding


def test_a_second_conversion_replaces_the_first():
    original = make("llama")
    model = copy.deepcopy(original)
    fh.convert(model, "hedgehog", features=16)
    fh.convert(model, "exact")  # generate() goes back to the key-value cache
    ids, mask = inputs()
    assert model.config.favor == {"method": "exact"}
    assert torch.equal(model.generate(ids, attention_mask=mask, max_new_tokens=4,
                                      do_sample=False),
                       original.generate(ids, attention_mask=mask, max_new_tokens=4,
                                         do_sample=False))


@pytest.mark.parametrize("method,options", [("hedgehog", dict(features=16)),
                                            ("vq", dict(codes=8))])
def test_a_bfloat16_model_attends_in_float32_and_generates(method, options):
    model = converted("llama", method, **options).to(torch.bfloat16)
    ids, mask = inputs()
    out = run(model, ids, mask)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()
    cache = fh.FavorCache()
    seq = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False,
                         cache=cache)
    assert seq.shape == (2, ids.shape[1] + 4) and cache.state_bytes > 0


@pytest.mark.parametrize("method,options", [("favor", dict(features=32)),
                                            ("vq", dict(codes=8)),
                                            ("favor", dict(features=32, window=4, sinks=1))])
def test_a_token_step_compiles_fullgraph_through_the_cache(method, options):
    """torch.compile(fullgraph=True) of a converted decoder's single-token step on the CPU:
    the cache layer's state (favor::decode_step / favor::hybrid_decode_step (a window and a
    sink) / favor::vq_decode_step, advanced in place)
    and the padding mask trace with no graph break, in one graph after the mask's length
    turns dynamic, and the logits equal the eager step's bit for bit."""
    from torch._dynamo.utils import counters
    model = converted("llama", method, **options)
    if method == "vq":  # the codebooks from a first batch (k-means), then fixed
        model(inputs(seed=3)[0])
    model.eval()
    ids, mask = inputs()

    def step(tok, pos, m, cache):
        return model(tok, attention_mask=m, cache=cache, position_ids=pos).logits

    def generate(run):
        cache, m, outs = fh.FavorCache(), mask, []
        with torch.no_grad():
            tok = model(ids, attention_mask=m, cache=cache).logits[:, -1:].argmax(-1)
            for _ in range(4):
                m = torch.cat([m, torch.ones(m.shape[0], 1, dtype=m.dtype)], 1)
                outs.append(run(tok, m.sum(1, keepdim=True) - 1, m, cache))
                tok = outs[-1][:, -1:].argmax(-1)
        return outs

    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    eager = generate(step)
    torch._dynamo.reset()
    counters.clear()
    compiled = generate(torch.compile(step, fullgraph=True, backend=record))
    assert counters["stats"]["unique_graphs"] <= 2  # static first, then a dynamic mask
    op = "favor.vq_decode_step" if method == "vq" else "favor.hybrid_decode_step" \
        if "window" in options else "favor.decode_step"
    assert all(op in str(g.graph) for g in graphs)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)


def test_a_cache_holding_earlier_keys_is_refused_unchanged():
    """A key-value cache that already holds tokens (filled by the softmax model) cannot become
    favor's state: refused with an error naming the cache, and its layer left in place."""
    model = make("llama")
    ids, _ = inputs()
    cache = tf.DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids[:, :6], cache=cache)
    fh.convert(model, "favor", features=16)
    before = type(cache.layers[0])
    with pytest.raises(favor.Error, match="holds 6 earlier tokens"):
        model(ids[:, 6:], cache=cache)
    assert type(cache.layers[0]) is before
