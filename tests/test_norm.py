"""F.layer_norm over the last axis.

Forward values against a plain NumPy reference built on ``np.var``; gradients against float64
finite differences through ``tinymlp.gradcheck``; a backward that drops the x_hat term must be
caught; a constant row (zero variance) stays finite.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tinymlp.functional as F
from tinymlp import GradcheckError, gradcheck, tensor
from tinymlp.backend import to_device
from tinymlp.ops.norm import LayerNorm

pytestmark = pytest.mark.usefixtures("tier")   # every test on the fast and the reference tier

seeds = st.integers(0, 2**32 - 1)
with_device = settings(
    suppress_health_check=[*settings.default.suppress_health_check, HealthCheck.function_scoped_fixture]
)


def reference_layer_norm(x, gamma, beta, eps):
    mu = x.mean(axis=-1, keepdims=True)
    var = np.var(x, axis=-1, keepdims=True)
    out = (x - mu) / np.sqrt(var + eps)
    return out * (1 if gamma is None else gamma) + (0 if beta is None else beta)


def leaves(rng, shape, device="cpu", dtype="float64", affine=(True, True)):
    leaf = lambda a: tensor(a, requires_grad=True, dtype=dtype, device=device)  # noqa: E731
    d = shape[-1]
    return (
        leaf(rng.normal(size=shape) * 2 + 1),
        leaf(1 + 0.5 * rng.normal(size=d)) if affine[0] else None,
        leaf(0.5 * rng.normal(size=d)) if affine[1] else None,
    )


@pytest.mark.parametrize("affine", [(True, True), (True, False), (False, True), (False, False)])
@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 6), (4, 1)])
def test_forward_matches_numpy_var(shape, affine, device):
    x, w, b = leaves(np.random.default_rng(0), shape, device, affine=affine)
    y = F.layer_norm(x, w, b, eps=1e-5)
    expected = reference_layer_norm(x.numpy(), None if w is None else w.numpy(), None if b is None else b.numpy(), 1e-5)
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-12, atol=1e-12)


@with_device
@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5),
       eps=st.sampled_from([1e-5, 0.1]), seed=seeds)
def test_gradcheck(shape, eps, seed, device):
    if shape[-1] == 2:
        # two values normalise to +-sqrt(var/(var + eps)) ~ +-1 whatever x is: dL/dx is of
        # order eps, below the checker's noise floor for eps = 1e-5; a larger eps makes it visible
        eps = 0.1
    x, w, b = leaves(np.random.default_rng(seed), shape, device)
    gradcheck(F.layer_norm, (x, w, b), kwargs={"eps": eps}, seed=seed)


@pytest.mark.parametrize("affine", [(True, False), (False, True), (False, False)])
def test_gradcheck_without_scale_or_shift(affine):
    x, w, b = leaves(np.random.default_rng(1), (3, 4), affine=affine)
    gradcheck(F.layer_norm, (x, w, b), kwargs={"eps": 1e-6})


def test_constant_row_gives_finite_output_and_gradients(device):
    rng = np.random.default_rng(2)
    x, w, b = leaves(rng, (3, 8), device)
    x.data[1] = 0.1  # a constant row: zero variance
    y = F.layer_norm(x, w, b)
    assert np.isfinite(y.numpy()).all()
    np.testing.assert_allclose(y.numpy()[1], b.numpy(), atol=1e-9)  # x_hat = 0 there
    y.backward(rng.normal(size=y.shape))
    for t in (x, w, b):
        assert np.isfinite(to_device(t.grad, "cpu")).all()
    gradcheck(F.layer_norm, (x, w, b))  # and the gradient there is right, not just finite


def test_float32_stays_float32(device):
    x, w, b = leaves(np.random.default_rng(3), (2, 3, 8), device, dtype="float32")
    y = F.layer_norm(x, w, b)
    assert y.dtype == np.float32
    y.backward(np.ones(y.shape, dtype=np.float32))
    assert x.grad.dtype == w.grad.dtype == b.grad.dtype == np.float32
    expected = reference_layer_norm(*(t.numpy().astype(np.float64) for t in (x, w, b)), 1e-5)
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_shape_and_dtype_errors_name_the_op():
    x = tensor(np.ones((2, 4)))
    with pytest.raises(ValueError, match=r"layer_norm: weight of shape \(3,\).*\(2, 4\).*expected \(4,\)"):
        F.layer_norm(x, tensor(np.ones(3)), tensor(np.zeros(4)))
    with pytest.raises(TypeError, match="layer_norm: bias is float64 but the input is float32"):
        F.layer_norm(x, tensor(np.ones(4)), tensor(np.zeros(4), dtype="float64"))


class DroppedTerm(LayerNorm):
    """A planted bug: dx = r (g - mean(g)), forgetting the term through the variance."""

    @staticmethod
    def backward(ctx, grad):
        x_hat, r, weight = ctx.saved_tensors          # x_hat (..., D), r (..., 1)
        dropped = r * x_hat * (grad * weight * x_hat).mean(axis=-1, keepdims=True)
        dx, dweight, dbias = LayerNorm.backward(ctx, grad)
        return dx + dropped, dweight, dbias


def test_dropped_term_is_caught():
    x, w, b = leaves(np.random.default_rng(4), (3, 5))

    def buggy(x, weight, bias):
        return DroppedTerm.apply(x, weight, bias)

    with pytest.raises(GradcheckError) as err:
        gradcheck(buggy, (x, w, b))
    per_tensor = err.value.report.per_tensor
    assert per_tensor["x"].verdict == "FAIL"
    assert per_tensor["weight"].verdict == per_tensor["bias"].verdict == "ok"


@pytest.mark.parametrize("numba", [True, False])
@pytest.mark.parametrize("scale", [1e20, 1e30])
def test_huge_rows_normalise_instead_of_overflowing_to_zero(scale, numba):
    """float32 rows whose deviations pass sqrt(max float32) = 1.8e19: squaring them overflows,
    var = inf and x_hat = 0 without the scaled variance. LayerNorm is scale-invariant, so the
    result must equal the normalised unscaled rows."""
    from tinymlp.fast import compiled

    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 8)).astype(np.float32)
    before = compiled.is_enabled()
    compiled.set_enabled(numba and before)
    try:
        big = tensor(x * np.float32(scale), requires_grad=True)
        y = F.layer_norm(big, None, None, eps=1e-5)
        y.backward(np.ones((3, 8), dtype=np.float32))
    finally:
        compiled.set_enabled(before)
    expected = (x - x.mean(-1, keepdims=True)) / x.std(-1, keepdims=True)
    np.testing.assert_allclose(y.data, expected, rtol=1e-4, atol=1e-5)
    assert np.isfinite(big.grad).all()


@pytest.mark.parametrize("rows, dim", [(21, 8), (2053, 128)])     # the second above PARALLEL_MIN
def test_the_compiled_float32_sums_stay_within_float32_accuracy_of_the_float64_formulas(rows, dim):
    """The compiled kernels sum in float32 (each row's D values; the parameters' column sums over
    runs of rows, each run then added in float64): y, dx, dweight and dbias stay within float32
    accuracy of float64 formulas, with a last run shorter than the others (21 and 2053 rows)."""
    from tinymlp.fast import compiled
    from tinymlp.fast.kernels import norm_numba

    if not compiled.available():
        pytest.skip("the compiled LayerNorm")
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((rows, dim)) * 3 + 2).astype(np.float32)
    g = rng.standard_normal((rows, dim)).astype(np.float32)
    w, b = rng.standard_normal(dim).astype(np.float32), rng.standard_normal(dim).astype(np.float32)
    y, mean, rstd = norm_numba.forward_rows(x, w, b, 1e-5)
    dx, dw, db = norm_numba.backward_rows(g, x, mean, rstd, rstd, w, True)

    x64, g64, w64 = x.astype(np.float64), g.astype(np.float64), w.astype(np.float64)
    mu = x64.mean(-1, keepdims=True)
    r = 1 / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
    xhat = (x64 - mu) * r
    gh = g64 * w64
    dx64 = r * (gh - gh.mean(-1, keepdims=True) - xhat * (gh * xhat).mean(-1, keepdims=True))
    np.testing.assert_allclose(mean, mu[:, 0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y, xhat * w64 + b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dx, dx64, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dw, (g64 * xhat).sum(0), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(db, g64.sum(0), rtol=1e-5, atol=1e-4)
