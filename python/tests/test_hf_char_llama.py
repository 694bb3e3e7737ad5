"""Smoke test of examples/hf/char_llama.py: a tiny Llama trains 3 steps with a finite loss,
and the shipped checkpoint examples/hf/char_llama reaches below 3 bits per character."""
import math
import os
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HF = os.path.join(ROOT, "examples", "hf")
sys.path.insert(0, HF)

import char_llama  # noqa: E402
from favor.models.data import CharData  # noqa: E402

TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"
        "First Citizen:\nYou are all resolved rather to die than to famish?\n") * 8


def test_tiny_model_trains():
    torch.manual_seed(0)
    data = CharData(TEXT)
    model = char_llama.make_model(data.vocab, hidden_size=32, intermediate_size=64,
                                  num_hidden_layers=1, num_attention_heads=2,
                                  num_key_value_heads=1, max_position_embeddings=64)
    logs = []
    evals = char_llama.train(model, data, 3, batch=4, context=32, warmup=1, eval_every=None,
                             log=logs.append, progress=False)
    assert [s for s, _ in evals] == [3]
    assert math.isfinite(evals[0][1]) and evals[0][1] > 0
    bpc = char_llama.bits_per_char(model, data, "val", context=32, count=4, batch=2)
    assert math.isfinite(bpc)
    assert model.training  # bits_per_char restores the mode


def test_shipped_checkpoint_below_3_bpc():
    ckpt = os.path.join(HF, "char_llama")
    if not os.path.exists(os.path.join(ckpt, "model.safetensors")):
        pytest.skip("no checkpoint in examples/hf/char_llama")
    model, data = char_llama.load(ckpt)
    assert model.config.num_key_value_heads == 2
    assert char_llama.bits_per_char(model, data, "val", context=256, count=16) < 3.0
