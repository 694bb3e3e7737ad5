"""FavorAttention trains: a small causal transformer learns the copy task with FAVOR+ as well
as the same model with exact softmax attention (examples/train_copy.py).

Copying x1..xL SEP x1..xL needs each output to attend to the one position L+1 tokens back,
so it is learnt only if attention itself learns (forward and backward of favor.torch).
Fixed seeds: weights, random features and batches are all drawn from `seed`, so every run
trains the same models; rerun one with
    PYTHONPATH=build/python python3 examples/train_copy.py --seed 0 --steps 200
Each train() call takes ~6-10 s on 2 cores.
"""
import math
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))
from train_copy import DEFAULTS, train  # noqa: E402

STEPS = 200  # both models have learnt the copy by step ~80 (loss < 0.01 from step ~100)
CHANCE = math.log(DEFAULTS["symbols"])  # 2.77: the loss of a uniform guess on the copy


@pytest.fixture(scope="module")
def exact():
    return train("exact", steps=STEPS, seed=0)


def test_favor_trains_as_well_as_exact_attention(exact):
    favor = train("favor", steps=STEPS, seed=0)
    # A different computation, not the exact model under another name.
    assert favor.losses != exact.losses
    # Both learnt the copy: held-out loss below 0.05 (55x below chance; measured ~0.005 for
    # both, seeds 0-2) and every copied token right but for rare slips.
    for r in (favor, exact):
        assert r.final_loss < 0.05 < CHANCE, (r.method, r.final_loss)
        assert r.accuracy >= 0.99, (r.method, r.accuracy)
        assert r.sequence_accuracy >= 0.95, (r.method, r.sequence_accuracy)
    # FAVOR+ ends near exact attention: at most 0.01 above it. Measured gap: 0.0001-0.0002
    # (seeds 0-2); a model that copies with a few slips per hundred sequences has ~0.02, and
    # redrawing the features every 50 steps costs ~0.017 (test below), so 0.01 separates
    # "as good as exact" from "learnt, but worse".
    assert favor.final_loss <= exact.final_loss + 0.01, (favor.final_loss, exact.final_loss)


def test_one_random_feature_cannot_copy():
    # The criterion above has power: with m = 1, phi(q) and phi(k) are scalars and the
    # normalised weights phi(q) phi(k_j) / sum_j' phi(q) phi(k_j') = phi(k_j) / sum_j' phi(k_j')
    # do not depend on the query, so no query can single out its own source position.
    # Measured: loss 1.78, accuracy 36%.
    r = train("favor", steps=STEPS, seed=0, features=1)
    assert r.final_loss > 0.5, r.final_loss
    assert r.accuracy < 0.9, r.accuracy


def test_favor_trains_with_feature_redraws():
    # The Performer's policy: new random features every 50 training steps (3 redraws in 200
    # steps). Each redraw perturbs the learnt attention (the loss jumps, then recovers), so
    # the bound is looser than with fixed features: learnt (loss < 0.1, 28x below chance;
    # measured 0.021 and 0.023 for seeds 0 and 1) and at most 1% of copied tokens wrong.
    r = train("favor", steps=STEPS, seed=0, feature_redraw_interval=50)
    assert [b.attn.redraws for b in r.model.blocks] == [3, 3]
    assert r.final_loss < 0.1, r.final_loss
    assert r.accuracy >= 0.99, r.accuracy
