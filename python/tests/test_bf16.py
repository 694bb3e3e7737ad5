"""precision='bf16' of favor.attention (docs/numerics.md, "bf16 forward"): the binding passes
the option to C++ (whose tests/test_bf16.cpp checks the derived rounding bound against the
double reference); here: the fallback is the f32 path bit for bit (FAVOR_NO_BF16, causal),
a bad name is a ValueError naming the argument, and where bf16 runs it rounds (the output
differs from f32) by less than the estimator's own error at m = 256 (the claim measured by
favor bench --sections bf16)."""
import numpy as np
import pytest

import favor

B, H, N, D = 1, 2, 300, 64
NORM = D ** 0.25


def inputs(seed=0):
    rng = np.random.default_rng(seed)
    q, k = (x * NORM / np.linalg.norm(x, axis=-1, keepdims=True)
            for x in (rng.standard_normal((B, H, N, D)) for _ in range(2)))
    v = rng.standard_normal((B, H, N, D))
    return q.astype(np.float32), k.astype(np.float32), v.astype(np.float32)


def test_bad_precision_is_a_value_error():
    q, k, v = inputs()
    with pytest.raises(ValueError, match="precision: 'f16' must be f32 or bf16"):
        favor.attention(q, k, v, precision="f16")
    with pytest.raises(ValueError, match="precision: only method='favor'"):
        favor.attention(q, k, v, method="exact", precision="bf16")


def test_forced_off_and_causal_run_f32_bit_for_bit(monkeypatch):
    q, k, v = inputs(1)
    for causal in (False, True):
        f32 = favor.attention(q, k, v, causal=causal, features=256)
        if causal:
            out = favor.attention(q, k, v, causal=True, features=256, precision="bf16")
        else:
            with monkeypatch.context() as m:
                m.setenv("FAVOR_NO_BF16", "1")
                assert not favor.bf16_available()
                out = favor.attention(q, k, v, features=256, precision="bf16")
        assert np.array_equal(out, f32)


def test_bf16_rounds_less_than_the_estimator_errs():
    if not favor.bf16_available():
        pytest.skip("no bf16 here (the fallback is tested above)")
    q, k, v = inputs(2)
    f32 = favor.attention(q, k, v, features=256)
    bf16 = favor.attention(q, k, v, features=256, precision="bf16")
    exact = favor.exact_attention(q, k, v, accumulate="f64")
    added = favor.relative_frobenius_error(bf16, f32)
    assert added > 0.0
    assert added < favor.relative_frobenius_error(f32, exact)
