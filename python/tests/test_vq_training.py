"""VQAttention trains: a small causal transformer with Transformer-VQ attention (EMA
codebooks, k-means initialisation, commitment loss, dead-code reset) learns the copy task
of examples/train_copy.py about as well as the same model with exact softmax attention
(examples/train_vq.py).

Copying x1..xL SEP x1..xL needs each output to attend to the one position L+1 tokens back;
with VQ a query can single a key out only through its code, so it is learnt only if the
codebooks separate the positions the copy needs. Fixed seeds (weights, k-means, re-seeding,
batches); rerun one with
    PYTHONPATH=build/python python3 examples/train_vq.py --seed 0 --steps 300
~12 s per VQ run and ~8 s per exact run on 2 cores.
"""
import math
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))
from train_vq import DEFAULTS, train  # noqa: E402

STEPS = 300
CHANCE = math.log(DEFAULTS["symbols"])  # 2.77


@pytest.fixture(scope="module")
def exact():
    return train("exact", steps=STEPS, seed=0)


def test_vq_trains_about_as_well_as_exact_attention_with_no_dead_codes(exact):
    vq = train("vq", steps=STEPS, seed=0)
    assert vq.losses != exact.losses
    # Both learnt the copy: every copied token right (measured: 100.0% for both, seeds 0-2).
    for r in (vq, exact):
        assert r.final_loss < 0.05 < CHANCE, (r.method, r.final_loss)
        assert r.accuracy >= 0.99 and r.sequence_accuracy >= 0.95, r.method
    # VQ ends near exact attention: at most 0.01 above it (measured held-out losses, seeds
    # 0/1/2: VQ 0.0034/0.0032/0.0031, exact 0.0025/0.0027/0.0027, so gaps 0.0005-0.0009;
    # a model that copies with a few slips per hundred sequences sits at ~0.02).
    assert vq.final_loss <= exact.final_loss + 0.01, (vq.final_loss, exact.final_loss)
    # No dead codes: every code of every head is the nearest code of some key of the
    # held-out sequences (measured: 0 of 128 unused in both layers, seeds 0-2). The resets
    # did happen during training (codes moved off empty regions), so the criterion is not
    # met by a codebook that never needed them.
    assert vq.heldout_dead == [0, 0], vq.heldout_dead
    assert all(n > 0 for n in vq.codes_reset), vq.codes_reset


def test_one_code_cannot_copy():
    # The criterion above has power: with one code every key quantises to the same vector,
    # so each query attends uniformly to its prefix and cannot single out its source.
    # Measured: loss 2.45, accuracy 19% (seed 0).
    r = train("vq", steps=STEPS, seed=0, codes=1)
    assert r.final_loss > 0.5, r.final_loss
    assert r.accuracy < 0.9, r.accuracy
