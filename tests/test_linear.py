"""F.linear: y = x @ W + b over the last axis of an input of any rank.

Forward values against explicit loops; gradients against float64 finite differences through
``tinymlp.gradcheck``; a transposed weight gradient planted in backward must be caught.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tinymlp.functional as F
from tinymlp import GradcheckError, gradcheck, tensor
from tinymlp.backend import to_device
from tinymlp.ops.linear import Linear

pytestmark = pytest.mark.usefixtures("tier")   # every test on the fast and the reference tier

seeds = st.integers(0, 2**32 - 1)
# the `device` fixture is a constant string, safe to share between hypothesis examples
with_device = settings(
    suppress_health_check=[*settings.default.suppress_health_check, HealthCheck.function_scoped_fixture]
)


def reference_linear(x, W, b):
    """y[..., o] = sum_i x[..., i] W[i, o] + b[o], one output element at a time."""
    y = np.zeros(x.shape[:-1] + (W.shape[1],))
    for idx in np.ndindex(*x.shape[:-1]):
        for o in range(W.shape[1]):
            y[idx + (o,)] = sum(x[idx + (i,)] * W[i, o] for i in range(W.shape[0])) + (0 if b is None else b[o])
    return y


def leaves(rng, lead, d_in, d_out, bias, device="cpu", dtype="float64"):
    leaf = lambda a: tensor(a, requires_grad=True, dtype=dtype, device=device)  # noqa: E731
    return (
        leaf(rng.normal(size=(*lead, d_in))),
        leaf(rng.normal(size=(d_in, d_out))),
        leaf(rng.normal(size=d_out)) if bias else None,
    )


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("lead", [(), (1,), (3,), (2, 3), (2, 1, 2)])
def test_forward_matches_loops(lead, bias, device):
    x, W, b = leaves(np.random.default_rng(0), lead, 3, 2, bias, device)
    y = F.linear(x, W, b)
    assert y.shape == (*lead, 2)
    expected = reference_linear(x.numpy(), W.numpy(), None if b is None else b.numpy())
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-12, atol=1e-12)


@with_device
@given(
    lead=st.lists(st.integers(1, 3), min_size=0, max_size=3).map(tuple),
    d_in=st.integers(1, 4),
    d_out=st.integers(1, 4),
    bias=st.booleans(),
    seed=seeds,
)
def test_gradcheck(lead, d_in, d_out, bias, seed, device):
    x, W, b = leaves(np.random.default_rng(seed), lead, d_in, d_out, bias, device)
    gradcheck(F.linear, (x, W, b), seed=seed)


def test_gradcheck_non_contiguous_input(device):
    rng = np.random.default_rng(1)
    x = tensor(rng.normal(size=(4, 3, 2)).transpose(2, 1, 0), requires_grad=True, dtype="float64", device=device)
    assert not x.data.flags.c_contiguous
    W = tensor(rng.normal(size=(4, 3)), requires_grad=True, dtype="float64", device=device)
    gradcheck(F.linear, (x, W), seed=1)


def test_only_requested_gradients_are_computed():
    rng = np.random.default_rng(2)
    x = tensor(rng.normal(size=(2, 3)))  # a constant input
    W = tensor(rng.normal(size=(3, 2)), requires_grad=True)
    F.linear(x, W).sum().backward()
    assert x.grad is None and W.grad.shape == (3, 2)
    np.testing.assert_allclose(W.grad, x.numpy().sum(0)[:, None] * np.ones((1, 2)), rtol=1e-6)


def test_float32_stays_float32(device):
    x, W, b = leaves(np.random.default_rng(3), (2, 3), 4, 5, True, device, dtype="float32")
    y = F.linear(x, W, b)
    assert y.dtype == np.float32
    y.sum().backward()
    assert x.grad.dtype == W.grad.dtype == b.grad.dtype == np.float32


def test_shape_mismatch_names_the_op_and_the_shapes():
    x = tensor(np.ones((2, 3)))
    with pytest.raises(ValueError, match=r"linear: input of shape \(2, 3\).*weight of shape \(4, 5\)"):
        F.linear(x, tensor(np.ones((4, 5))))
    with pytest.raises(ValueError, match=r"linear: bias of shape \(4,\).*expected \(5,\)"):
        F.linear(x, tensor(np.ones((3, 5))), tensor(np.ones(4)))
    with pytest.raises(ValueError, match="linear: weight must be 2-D"):
        F.linear(x, tensor(np.ones(3)))
    with pytest.raises(TypeError, match="linear: .*share one dtype"):
        F.linear(x, tensor(np.ones((3, 5)), dtype="float64"))


class TransposedWeightGrad(Linear):
    """The classic slip: dW = G^T X instead of X^T G (shapes agree when W is square)."""

    @staticmethod
    def backward(ctx, grad):
        dx, dw, db = Linear.backward(ctx, grad)
        return dx, dw.T.copy(), db


def test_transposed_weight_gradient_is_caught():
    x, W, b = leaves(np.random.default_rng(4), (2, 3), 4, 4, True)

    def buggy(x, weight, bias):
        return TransposedWeightGrad.apply(x, weight, bias)

    gradcheck(F.linear, (x, W, b))  # the control: the real op passes on the same inputs
    with pytest.raises(GradcheckError) as err:
        gradcheck(buggy, (x, W, b))
    per_tensor = err.value.report.per_tensor
    assert per_tensor["weight"].verdict == "FAIL"
    assert per_tensor["weight"].hint_kind == "transpose"
    assert per_tensor["x"].verdict == per_tensor["bias"].verdict == "ok"


def test_gradient_on_device_matches_cpu(device):
    x, W, b = leaves(np.random.default_rng(5), (2, 3), 4, 2, True, device)
    F.linear(x, W, b).sum().backward()
    xc, Wc, bc = leaves(np.random.default_rng(5), (2, 3), 4, 2, True)
    F.linear(xc, Wc, bc).sum().backward()
    for a, c in ((x, xc), (W, Wc), (b, bc)):
        np.testing.assert_allclose(to_device(a.grad, "cpu"), c.grad, rtol=1e-12)
