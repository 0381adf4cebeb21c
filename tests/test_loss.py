"""Softmax cross-entropy: hard and soft targets, label smoothing, numerics, errors.

Forward values are compared with the textbook formula written here in plain NumPy
(-mean log(exp(x_y) / sum exp(x))); gradients with float64 finite differences.
"""

import math

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import tinymlp.functional as F
from tinymlp import gradcheck, tensor
from tinymlp.backend import to_device
from tinymlp.ops.loss import CrossEntropy

pytestmark = pytest.mark.usefixtures("tier")   # every test on the fast and the reference tier

seeds = st.integers(0, 2**32 - 1)


def reference_ce(x, t, alpha=0.0):
    """-(1/B) sum_b sum_k t_eff[b,k] log softmax(x)[b,k], term by term (small logits only)."""
    B, K = x.shape
    if t.ndim == 1:
        t = np.eye(K)[t]
    total = 0.0
    for b in range(B):
        z = sum(math.exp(v) for v in x[b])
        for k in range(K):
            t_eff = (1 - alpha) * t[b, k] + alpha / K
            total -= t_eff * math.log(math.exp(x[b, k]) / z)
    return total / B


def leaf(a, dtype="float64", device="cpu"):
    return tensor(a, requires_grad=True, dtype=dtype, device=device)


# --------------------------------------------------------------------------- forward values
@pytest.mark.parametrize("alpha", [0.0, 0.1, 1.0])
def test_hard_targets_match_the_formula(alpha, device):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(5, 4)), np.array([0, 3, 1, 1, 2])
    loss = F.cross_entropy(leaf(x, device=device), tensor(y, device=device), label_smoothing=alpha)
    assert loss.shape == ()
    assert loss.item() == pytest.approx(reference_ce(x, y, alpha), rel=1e-12)


@pytest.mark.parametrize("alpha", [0.0, 0.2])
def test_soft_targets_match_the_formula(alpha, device):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 6))
    t = rng.random((3, 6))
    t /= t.sum(axis=1, keepdims=True)  # mixup-like distributions
    loss = F.cross_entropy(leaf(x, device=device), to_device(t, device), label_smoothing=alpha)
    assert loss.item() == pytest.approx(reference_ce(x, t, alpha), rel=1e-12)


def test_one_hot_soft_targets_equal_hard_targets():
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(4, 5)), np.array([4, 0, 2, 2])
    hard = F.cross_entropy(leaf(x), y, label_smoothing=0.1).item()
    soft = F.cross_entropy(leaf(x), np.eye(5)[y], label_smoothing=0.1).item()
    assert hard == pytest.approx(soft, rel=1e-14)


def test_zero_logits_give_log_k():
    loss = F.cross_entropy(leaf(np.zeros((3, 10))), np.array([0, 5, 9]), label_smoothing=0.3)
    assert loss.item() == pytest.approx(math.log(10), rel=1e-14)


def test_gradient_is_softmax_minus_target_over_batch():
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(4, 3)), np.array([2, 0, 0, 1])
    lx = leaf(x)
    F.cross_entropy(lx, y, label_smoothing=0.1).backward()
    p = np.exp(x) / np.exp(x).sum(axis=1, keepdims=True)
    t = 0.9 * np.eye(3)[y] + 0.1 / 3
    np.testing.assert_allclose(lx.grad, (p - t) / 4, rtol=1e-12, atol=1e-15)


# --------------------------------------------------------------------------- numerics
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_huge_logits_are_finite_and_correct(dtype, device):
    x = np.array([[1e4, 0.0, -1e4], [0.0, 1e4, 0.0], [1e4, 1e4, -1e4]])
    y = np.array([0, 0, 1])
    lx = leaf(x, dtype=dtype, device=device)
    loss = F.cross_entropy(lx, tensor(y, device=device))
    # row 0: target is the max -> 0; row 1: 1e4 behind the max -> 1e4; row 2: a tie -> log 2
    assert loss.item() == pytest.approx((0 + 1e4 + math.log(2)) / 3, rel=1e-6)
    loss.backward()
    grad = to_device(lx.grad, "cpu")
    assert np.isfinite(grad).all()
    expected = np.array([[0, 0, 0], [-1, 1, 0], [0.5, -0.5, 0]]) / 3  # softmax - one_hot, over B
    np.testing.assert_allclose(grad, expected, atol=1e-7)


def test_float32_stays_float32():
    lx = leaf(np.random.default_rng(4).normal(size=(3, 4)), dtype="float32")
    t = tensor(np.full((3, 4), 0.25), requires_grad=True)
    loss = F.cross_entropy(lx, t, label_smoothing=0.1)
    assert loss.dtype == np.float32
    loss.backward()
    assert lx.grad.dtype == np.float32 and t.grad.dtype == np.float32


# --------------------------------------------------------------------------- gradients
def ce(logits, target, label_smoothing=0.0):
    return F.cross_entropy(logits, target, label_smoothing=label_smoothing)


@pytest.mark.parametrize("alpha", [0.0, 0.1])
@given(B=st.integers(1, 4), K=st.integers(1, 5), seed=seeds)
@example(B=1, K=1, seed=0)  # one class: the loss is 0 and so is its gradient, exactly
@example(B=1, K=2, seed=0)
def test_gradcheck_hard_targets(alpha, B, K, seed):
    rng = np.random.default_rng(seed)
    x = leaf(3 * rng.normal(size=(B, K)))
    y = rng.integers(0, K, size=B)
    gradcheck(ce, (x, y), kwargs={"label_smoothing": alpha}, seed=seed % 1000)


@pytest.mark.parametrize("alpha", [0.0, 0.1])
@given(B=st.integers(1, 4), K=st.integers(1, 5), seed=seeds)
@example(B=1, K=1, seed=0)
def test_gradcheck_soft_targets(alpha, B, K, seed):
    """Gradients for the logits and for the (here differentiable) soft targets."""
    rng = np.random.default_rng(seed)
    x = leaf(3 * rng.normal(size=(B, K)))
    t = rng.random((B, K)) + 0.1
    t = leaf(t / t.sum(axis=1, keepdims=True))        # distributions, entries away from 0
    gradcheck(ce, (x, t), kwargs={"label_smoothing": alpha}, seed=seed % 1000)


@pytest.mark.parametrize("target, what", [([[0.5, 0.7], [0.5, 0.5]], "row sums"),
                                          ([[1.5, -0.5], [0.5, 0.5]], "min entry")])
def test_soft_targets_that_are_not_distributions_are_refused(target, what):
    x = leaf(np.zeros((2, 2)))
    with pytest.raises(ValueError, match=f"soft targets must be distributions.*{what}"):
        ce(x, np.array(target))


def test_gradcheck_on_device(device):
    rng = np.random.default_rng(5)
    x = leaf(rng.normal(size=(3, 4)), device=device)
    gradcheck(ce, (x, tensor(np.array([3, 0, 1]), device=device)), kwargs={"label_smoothing": 0.1})


def test_backward_without_the_batch_mean_is_caught(monkeypatch):
    correct = CrossEntropy.backward
    monkeypatch.setattr(CrossEntropy, "backward",
                        staticmethod(lambda ctx, g: (correct(ctx, g)[0] * 4, None)))
    x = leaf(np.random.default_rng(6).normal(size=(4, 3)))
    report = gradcheck(ce, (x, np.array([0, 1, 2, 0])), raise_on_fail=False)
    assert not report.passed
    assert report.per_tensor["logits"].hint_kind == "mean_vs_sum"


# --------------------------------------------------------------------------- errors
def test_errors_are_clear():
    x = leaf(np.zeros((3, 4)))
    with pytest.raises(ValueError, match=r"class ids must be in \[0, 3\].*\[4\]"):
        F.cross_entropy(x, np.array([0, 4, 1]))
    with pytest.raises(ValueError, match=r"\[0, 3\].*\[-1\]"):
        F.cross_entropy(x, np.array([0, -1, 1]))
    with pytest.raises(ValueError, match=r"expected \(3,\) class ids"):
        F.cross_entropy(x, np.array([0, 1]))
    with pytest.raises(TypeError, match="integer class ids"):
        F.cross_entropy(x, np.array([0.0, 1.0, 2.0]))
    with pytest.raises(ValueError, match=r"soft target of shape \(3, 5\)"):
        F.cross_entropy(x, np.zeros((3, 5)))
    with pytest.raises(ValueError, match=r"logits must have shape \(batch, classes\)"):
        F.cross_entropy(leaf(np.zeros(4)), np.array([0]))
    with pytest.raises(ValueError, match="label_smoothing"):
        F.cross_entropy(x, np.array([0, 1, 2]), label_smoothing=1.5)
