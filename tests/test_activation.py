"""F.gelu in its tanh form (default) and its exact erf form, and the erf/erfc it is built on.

Forward values against the formulas evaluated element by element with the ``math`` module;
gradients against float64 finite differences through ``tinymlp.gradcheck``.
"""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tinymlp.functional as F
from tinymlp import GradcheckError, gradcheck, no_grad, tensor
from tinymlp.ops.activation import GELU, erf, erfc

pytestmark = pytest.mark.usefixtures("tier")   # every test on the fast and the reference tier

seeds = st.integers(0, 2**32 - 1)
with_device = settings(
    suppress_health_check=[*settings.default.suppress_health_check, HealthCheck.function_scoped_fixture]
)


def reference_gelu(x, approximate):
    if approximate:
        f = lambda v: 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))  # noqa: E731
    else:
        f = lambda v: v * 0.5 * (1 + math.erf(v / math.sqrt(2)))  # noqa: E731
    return np.vectorize(f)(x)


def test_erf_and_erfc_match_math_to_float64_precision():
    x = np.concatenate([np.linspace(-30, 30, 20001), np.geomspace(1e-300, 1, 200), -np.geomspace(1e-300, 1, 200),
                        [0.0, 0.46875, -0.46875, 4.0, -4.0, 26.5]])
    for ours, ref in ((erf, math.erf), (erfc, math.erfc)):
        expected = np.array([ref(v) for v in x])
        got = ours(x)
        tiny = np.abs(expected) < 1e-300  # deep in erfc's tail both underflow to (sub)normal dust
        np.testing.assert_allclose(got[~tiny], expected[~tiny], rtol=2e-15, atol=0)
        np.testing.assert_allclose(got[tiny], expected[tiny], atol=1e-300)
    assert erf(np.array(0.25)).shape == ()
    np.testing.assert_array_equal(erfc(np.array([np.inf, -np.inf])), [0.0, 2.0])
    assert np.isnan(erf(np.array([np.nan]))).all()
    assert erf(np.float32([0.5, 2.0])).dtype == np.float32


@pytest.mark.parametrize("approximate", [True, False])
def test_forward_matches_formula(approximate, device):
    x = np.linspace(-8, 8, 81)
    y = F.gelu(tensor(x, dtype="float64", device=device), approximate=approximate)
    np.testing.assert_allclose(y.numpy(), reference_gelu(x, approximate), rtol=1e-13, atol=1e-15)


def test_the_two_forms_differ_by_less_than_1e3():
    x = np.linspace(-6, 6, 1001)
    diff = F.gelu(tensor(x, dtype="float64")).numpy() - F.gelu(tensor(x, dtype="float64"), approximate=False).numpy()
    assert 1e-5 < np.abs(diff).max() < 1e-3


@with_device
@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4), approximate=st.booleans(), seed=seeds)
def test_gradcheck(shape, approximate, seed, device):
    # N(0, 1) values: far in the left tail (x < -4.5) dy/dx < 1e-5 falls below the checker's
    # noise floor, which the large-input test below covers with a plain central difference
    x = tensor(np.random.default_rng(seed).normal(size=shape), requires_grad=True, dtype="float64", device=device)
    gradcheck(F.gelu, (x,), kwargs={"approximate": approximate}, seed=seed)


@pytest.mark.parametrize("approximate", [True, False])
def test_large_input_is_processed_in_chunks_with_the_same_result(approximate):
    # 3 * 40000 elements: more than one 64K chunk, and a ragged last chunk
    x = np.random.default_rng(0).normal(size=(3, 40000)) * 3
    y = F.gelu(tensor(x, requires_grad=True, dtype="float64"), approximate=approximate)
    np.testing.assert_allclose(y.numpy()[:, ::997], reference_gelu(x[:, ::997], approximate), rtol=1e-13, atol=1e-15)
    xt = tensor(x, requires_grad=True, dtype="float64")
    F.gelu(xt, approximate=approximate).backward(np.ones_like(x))
    eps = 1e-6  # central difference of the op itself, elementwise
    numerical = (F.gelu(tensor(x + eps, dtype="float64"), approximate=approximate).numpy()
                 - F.gelu(tensor(x - eps, dtype="float64"), approximate=approximate).numpy()) / (2 * eps)
    np.testing.assert_allclose(xt.grad, numerical, rtol=1e-6, atol=1e-8)


def test_no_grad_forward_gives_the_same_values():
    x = np.random.default_rng(1).normal(size=(5, 7))
    y = F.gelu(tensor(x, requires_grad=True, dtype="float64")).numpy()
    with no_grad():
        np.testing.assert_array_equal(F.gelu(tensor(x, requires_grad=True, dtype="float64")).numpy(), y)


@pytest.mark.parametrize("approximate", [True, False])
def test_float32_stays_float32(approximate, device):
    x = tensor(np.random.default_rng(2).normal(size=(4, 5)), requires_grad=True, device=device)
    y = F.gelu(x, approximate=approximate)
    assert y.dtype == np.float32
    y.sum().backward()
    assert x.grad.dtype == np.float32
    expected = reference_gelu(x.numpy().astype(np.float64), approximate)
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-5, atol=1e-6)


class MissingSecondTerm(GELU):
    """A planted bug: dy/dx = (1 + t)/2 only, as if GELU were x times a constant gate."""

    @staticmethod
    def forward(ctx, x, approximate=True):
        y = GELU.forward(ctx, x, approximate=approximate)
        ctx.save_for_backward(y / x)  # h = (1 + t)/2 for x != 0
        return y


def test_gelu_derivative_without_its_second_term_is_caught():
    x = tensor(np.random.default_rng(3).normal(size=(3, 4)), requires_grad=True, dtype="float64")
    with pytest.raises(GradcheckError):
        gradcheck(lambda x: MissingSecondTerm.apply(x), (x,))
