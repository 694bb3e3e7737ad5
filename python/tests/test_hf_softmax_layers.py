"""favor.hf's per-layer plan: convert(..., softmax_layers=[i, ...]) keeps those layers on the
model's own softmax attention (its mask, its implementation, a key-value cache in
generate()), the others on favor's method.

Every layer listed is the original model bit for bit (the same attention function with the
same mask: torch.equal, not a tolerance). A mixed model's generate() (greedy and beam search,
left padding) equals its own full forward: the favor layers decode through their state (the
chunked kernel against the step, summed in another order: atol 1e-4, as in test_hf.py),
the softmax layers through their keys and values.
"""
import copy

import pytest
import torch
import transformers as tf

import favor
import favor.hf as fh
from hf_models import (DECODERS, FAMILIES, batches, generates_as_full_forward, inputs, make,
                       run)


def four(family):
    """A tiny model of `family` with 4 layers (so a plan can mix)."""
    return make(family, num_hidden_layers=4)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_layer_on_softmax_is_the_original_bit_for_bit(family):
    original = four(family)
    model = copy.deepcopy(original)
    report = fh.convert(model, "favor", features=16, softmax_layers=[0, 1, 2, 3])
    assert all(r.core.startswith("softmax (sdpa") for r in report)
    assert fh.cores(model) == []
    ids, mask = inputs(left=family != "bert")
    assert torch.equal(run(model, ids, mask), run(original, ids, mask))
    if family != "bert":
        kw = dict(attention_mask=mask, max_new_tokens=5, do_sample=False)
        assert torch.equal(model.generate(ids, **kw), original.generate(ids, **kw))
        assert torch.equal(model.generate(ids, num_beams=3, **kw),
                           original.generate(ids, num_beams=3, **kw))


def test_the_eager_implementation_of_softmax_layers_is_the_eager_original():
    original = four("llama")
    original.set_attn_implementation("eager")
    model = copy.deepcopy(original)
    fh.convert(model, "hedgehog", features=8, softmax_layers=[0, 1, 2, 3])
    assert model.config.favor["softmax_attention"] == "eager"
    ids, mask = inputs()
    assert torch.equal(run(model, ids, mask), run(original, ids, mask))


@pytest.mark.parametrize("family", DECODERS)
@pytest.mark.parametrize("method,options", [("favor", dict(features=16)),
                                            ("window", dict(window=4, sinks=1)),
                                            ("hedgehog", dict(features=8, window=4))])
def test_a_mixed_model_generates_as_its_own_full_forward(family, method, options):
    model = four(family)
    fh.convert(model, method, softmax_layers=[1, 3], **options)
    assert [layer for layer, _, _ in fh.cores(model)] == [0, 2]
    ids, mask = inputs(n=12)
    generates_as_full_forward(model, ids, mask, 6)
    beam = model.generate(ids, attention_mask=mask, max_new_tokens=5, num_beams=3,
                          do_sample=False)
    assert torch.equal(beam, model.generate(ids, attention_mask=mask, max_new_tokens=5,
                                            num_beams=3, do_sample=False, use_cache=False))


def test_a_mixed_cache_holds_keys_for_softmax_layers_and_a_fixed_state_for_the_rest():
    model = four("llama")
    fh.convert(model, "favor", features=16, softmax_layers=[2])
    ids, mask = inputs()
    sizes, kv = [], []
    for new in (2, 12):
        cache = fh.FavorCache()
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False,
                             cache=cache)
        assert cache.get_seq_length() == ids.shape[1] + new - 1
        soft = cache.layers[2]
        assert soft.keys.shape[-2] == ids.shape[1] + new - 1 and not soft.favor
        assert all(cache.layers[i].keys is None and cache.layers[i].favor for i in (0, 1, 3))
        sizes.append(cache.state_bytes)
        kv.append(soft.keys.nbytes + soft.values.nbytes)
    # the favor layers' state stays; the softmax layer's keys and values grow by 10 tokens
    assert sizes[1] - sizes[0] == kv[1] - kv[0] == kv[0] // (ids.shape[1] + 1) * 10
    made = model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                          return_dict_in_generate=True)
    cache = made.past_key_values
    assert isinstance(cache.layers[2], tf.cache_utils.DynamicLayer)
    assert fh.cache_bytes(cache) == sizes[1]
    assert torch.equal(made.sequences, out)


@pytest.mark.parametrize("compact", [False, True])
def test_save_and_load_keep_the_plan(tmp_path, compact):
    original = four("llama")
    model = copy.deepcopy(original)
    fh.convert(model, "hedgehog", features=8, window=4, softmax_layers=[3, 0])
    assert model.config.favor["softmax_layers"] == [0, 3]
    assert model.config.favor["softmax_attention"] == "sdpa"
    if compact:
        fh.add_adapters(model, r=2)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.1)
    ids, mask = inputs()
    before = run(model, ids, mask)
    fh.save_pretrained(model, tmp_path / "m", compact=compact)
    loaded = fh.from_pretrained(str(tmp_path / "m"),
                                **({"base": copy.deepcopy(original)} if compact else {}))
    assert loaded.config.favor == model.config.favor
    assert torch.equal(run(loaded, ids, mask), before)
    assert [layer for layer, _, _ in fh.cores(loaded)] == [1, 2]


def test_transfer_and_distill_train_only_the_favor_layers():
    teacher = four("llama")
    model = copy.deepcopy(teacher)
    fh.convert(model, "hedgehog", features=8, window=4, softmax_layers=[1])
    report = fh.transfer(model, batches(2), steps=3, progress=False)
    assert [r["layer"] for r in report] == [0, 2, 3]
    result = fh.distill(model, teacher, batches(2), steps=2, progress=False)
    assert len(result) == 2 and all(torch.isfinite(torch.tensor(list(result))))
    everything = copy.deepcopy(teacher)
    fh.convert(everything, "hedgehog", features=8, softmax_layers=[0, 1, 2, 3])
    with pytest.raises(favor.Error, match="every layer is on softmax"):
        fh.transfer(everything, batches(1), steps=1, progress=False)


def test_a_mixed_encoder_attends_bidirectionally_with_padding():
    original = four("bert")
    model = copy.deepcopy(original)
    fh.convert(model, "exact", softmax_layers=[1, 2])
    ids, mask = inputs(left=False)
    torch.testing.assert_close(run(model, ids, mask), run(original, ids, mask), rtol=1e-5,
                               atol=2e-5)


@pytest.mark.parametrize("layers,rule", [([4], "4 is not a layer of the model"),
                                         ([1, 1], "layer 1 is listed twice"),
                                         ([-1], "not a layer index"),
                                         ("0", "must be a list of layer indices"),
                                         ([True], "not a layer index")])
def test_a_bad_plan_is_refused_by_name(layers, rule):
    model = four("llama")
    with pytest.raises(favor.Error, match=rule):
        fh.convert(model, "favor", softmax_layers=layers)
    assert not getattr(model.config, "favor", None)


def test_an_unknown_softmax_attention_is_refused():
    with pytest.raises(favor.Error, match="softmax_attention: 'nope'"):
        fh.convert(four("llama"), "favor", softmax_layers=[0], softmax_attention="nope")


def test_a_refused_core_leaves_the_model_as_it_was():
    model = four("llama")
    fh.convert(model, "favor", features=8, window=4)
    before = [m.favor_core for _, m, _ in fh.cores(model)]
    spec = dict(model.config.favor)
    with pytest.raises(favor.Error, match="gate"):
        fh.convert(model, "favor", features=8, softmax_layers=[0], gate=True)  # no window
    assert model.config.favor == spec
    assert [m.favor_core for _, m, _ in fh.cores(model)] == before


def test_softmax_layers_of_a_model_converted_from_eager_stay_eager():
    model = four("llama")
    model.set_attn_implementation("eager")
    fh.convert(model, "favor", features=8)
    with fh.softmax_at(model, [1]):
        assert model.config.favor["softmax_attention"] == "eager"


def test_favor_does_not_take_over_a_layer_that_holds_earlier_tokens():
    model = four("llama")
    fh.convert(model, "favor", features=8)
    ids, mask = inputs()
    cache = fh.FavorCache()
    with fh.softmax_at(model, [0, 1, 2, 3]):  # the prompt runs every layer on softmax
        model(ids, attention_mask=mask, cache=cache)
    nxt = torch.ones(2, 1, dtype=torch.long)
    with pytest.raises(favor.Error, match="earlier tokens as keys and values"):
        model(nxt, attention_mask=torch.cat([mask, nxt], 1), cache=cache)


def test_finetune_trains_a_mixed_model_softmax_layers_included():
    original = four("llama")
    model = copy.deepcopy(original)
    fh.convert(model, "hedgehog", features=8, window=4, softmax_layers=[2])
    soft = model.model.layers[2].self_attn
    before = {n: p.detach().clone() for n, p in soft.named_parameters()}
    losses = fh.finetune(model, batches(2), steps=3, lr=1e-3, progress=False)
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(list(losses))))
    # finetune trains what requires grad: the whole model, softmax layer included, moves
    assert any(not torch.equal(p, before[n]) for n, p in soft.named_parameters())
    assert soft.favor_core is None and soft.favor_softmax == "sdpa"
    ids, mask = inputs()
    assert torch.isfinite(run(model, ids, mask)).all()
