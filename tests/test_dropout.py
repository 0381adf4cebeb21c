"""Inverted dropout: identity in evaluation, the right statistics in training, the saved mask in backward."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tinymlp.functional as F
from tinymlp import gradcheck, tensor
from tinymlp.backend import to_device
from tinymlp.ops.dropout import Dropout

seeds = st.integers(0, 2**32 - 1)


def test_identity_when_not_training_or_p_zero():
    x = tensor(np.arange(6.0), requires_grad=True)
    assert F.dropout(x, 0.5, training=False) is x
    assert F.dropout(x, 0.0) is x


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5, "0.5", None, True])
def test_p_must_be_a_probability_below_one(p):
    with pytest.raises(ValueError, match=r"dropout: p must be a probability in \[0, 1\)"):
        F.dropout(tensor(np.ones(3)), p)


def test_rng_must_be_a_generator():
    with pytest.raises(TypeError, match="rng must be a random Generator"):
        F.dropout(tensor(np.ones(3)), 0.5, rng=3)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_statistics_and_scaling(dtype, device):
    p = 0.3
    x = tensor(np.ones(200_000), dtype=dtype, device=device)
    out = F.dropout(x, p, rng=np.random.default_rng(0))
    assert out.dtype == np.dtype(dtype)
    y = to_device(out.data, "cpu")
    dropped = (y == 0).mean()
    assert abs(dropped - p) < 0.005  # 5 standard deviations of a Binomial(200000, 0.3) fraction
    kept = y[y != 0]
    np.testing.assert_array_equal(kept, np.full(kept.shape, 1 / (1 - p), dtype=dtype))
    assert abs(y.mean() - 1) < 0.01  # E[out] = x


def test_same_seed_same_mask_and_a_generator_moves_on():
    x = tensor(np.ones((4, 50)))
    a = F.dropout(x, 0.5, rng=np.random.default_rng(7)).numpy()
    b = F.dropout(x, 0.5, rng=np.random.default_rng(7)).numpy()
    np.testing.assert_array_equal(a, b)
    rng = np.random.default_rng(7)
    c, d = F.dropout(x, 0.5, rng=rng).numpy(), F.dropout(x, 0.5, rng=rng).numpy()
    assert not np.array_equal(c, d)
    e, f = F.dropout(x, 0.5).numpy(), F.dropout(x, 0.5).numpy()  # default generator
    assert not np.array_equal(e, f)


def test_backward_uses_the_saved_mask(device):
    rng = np.random.default_rng(8)
    xv, g = rng.normal(size=(5, 7)), rng.normal(size=(5, 7))
    x = tensor(xv, requires_grad=True, dtype="float64", device=device)
    out = F.dropout(x, 0.4, rng=np.random.default_rng(1))
    out.backward(to_device(g, device))
    kept = to_device(out.data, "cpu") != 0
    np.testing.assert_array_equal(to_device(x.grad, "cpu"), g * (kept / 0.6))


def test_float32_stays_float32():
    x = tensor(np.ones((3, 4)), requires_grad=True)
    out = F.dropout(x, 0.5, rng=np.random.default_rng(0))
    out.sum().backward()
    assert out.dtype == np.float32 and x.grad.dtype == np.float32


@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4),
       p=st.floats(0.05, 0.9), seed=seeds)
def test_gradcheck_with_a_fixed_mask(shape, p, seed):
    """A freshly seeded generator per call gives the same mask on every forward of the check."""
    x = tensor(np.random.default_rng(seed).normal(size=shape), requires_grad=True, dtype="float64")
    gradcheck(lambda x: F.dropout(x, p, rng=np.random.default_rng(seed)), x, seed=seed % 1000)


def test_gradcheck_with_before_forward_reseeding():
    holder = {}

    def reseed():
        holder["rng"] = np.random.default_rng(3)

    def fn(x):
        return F.dropout(x, 0.5, rng=holder["rng"])

    x = tensor(np.random.default_rng(9).normal(size=(4, 5)), requires_grad=True, dtype="float64")
    gradcheck(fn, x, before_forward=reseed)


def test_backward_ignoring_the_mask_is_caught(monkeypatch):
    monkeypatch.setattr(Dropout, "backward", staticmethod(lambda ctx, g: g.copy()))
    x = tensor(np.random.default_rng(10).normal(size=(4, 5)), requires_grad=True, dtype="float64")
    report = gradcheck(lambda x: F.dropout(x, 0.5, rng=np.random.default_rng(0)), x, raise_on_fail=False)
    assert not report.passed
