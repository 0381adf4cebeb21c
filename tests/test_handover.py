"""A derivative handed over: the fast GELU offers its dy/dx (``ctx.elementwise_derivative``), the
compiled spatial gating unit multiplies it into the passes that write dL/dz, and GELU's own
backward pass drops out of the graph (tinymlp/fast/engine.py).

Expected gradients come from the reference tier (``fast.disabled()``, float64: the formulas of
ops/) and from finite differences (``gradcheck``) of the fast tier itself.
"""

from __future__ import annotations

import numpy as np
import pytest

import tinymlp.functional as F
from tinymlp import Tensor, fast, gradcheck, graph
from tinymlp.fast import compiled

pytestmark = pytest.mark.skipif(not compiled.available(), reason="the compiled SGU takes the derivative")

B, S, E = 3, 4, 5


def _token_major(a):
    """a (B, S, .) laid out token-major in memory, as the models' fast ops lay their activations."""
    return np.ascontiguousarray(a.transpose(1, 0, 2)).transpose(1, 0, 2)


def _values(seed=0, residual=False):
    rng = np.random.default_rng(seed)
    values = [_token_major(rng.standard_normal((B, S, 2 * E))), rng.standard_normal((S, S)) / 2,
              rng.standard_normal(S), 1 + 0.5 * rng.standard_normal(E), 0.5 * rng.standard_normal(E)]
    if residual:
        values.append(_token_major(rng.standard_normal((B, S, E))))
    return values, rng.standard_normal((B, S, E)), rng.standard_normal((B, S, 2 * E))


def _leaves(values):
    return [Tensor(v, requires_grad=True, dtype="float64") for v in values]


def _block(h, w, b, gamma, beta, residual=None):
    z = F.gelu(h)
    return z, F.spatial_gating(z, w, b, gamma, beta, gate_residual=residual)


def assert_reference_gradients(leaves, values, g):
    """The leaves' gradients equal the reference tier's for the block on ``values`` (float64)."""
    with fast.disabled():
        reference = _leaves(values)
        _, out = _block(*reference)
        (out * Tensor(g)).sum().backward()
    for a, b in zip(leaves, reference):
        np.testing.assert_allclose(a.grad, b.grad, rtol=1e-10, atol=1e-12)


def _names(t):
    return [type(node).__name__ if not hasattr(node, "fn") else node.fn.__name__ for node in graph.ops(t)]


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("readers", ["the gate only", "the gate, then another op", "another op, then the gate"])
def test_the_gate_that_takes_gelus_derivative_gives_the_reference_gradients(residual, readers):
    values, g, g2 = _values(residual=residual)
    results = []
    for on in (True, False):
        leaves = _leaves(values)
        with fast.enabled() if on else fast.disabled():
            z, out = _block(*leaves)
            loss = (out * Tensor(g)).sum()
            if readers == "the gate, then another op":
                loss = loss + (z * Tensor(g2)).sum()
            elif readers == "another op, then the gate":
                loss = (z * Tensor(g2)).sum() + loss
            names = _names(out)
            loss.backward()
        results.append((names, [t.grad for t in leaves]))
    (fast_names, fast_grads), (_, reference_grads) = results
    assert "GELU" not in " ".join(fast_names), f"GELU still runs its backward behind the gate: {fast_names}"
    for got, want in zip(fast_grads, reference_grads):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_a_retained_graph_gives_the_same_gradients_twice():
    """The gate reads GELU's dy/dx on every backward and GELU no longer writes into it."""
    values, g, g2 = _values(seed=1)
    leaves = _leaves(values)
    with fast.enabled():
        z, out = _block(*leaves)
        loss = (out * Tensor(g)).sum() + (z * Tensor(g2)).sum()
        loss.backward(retain_graph=True)
        first = [t.grad.copy() for t in leaves]
        for t in leaves:
            t.grad = None
        loss.backward()
    for a, b in zip(first, (t.grad for t in leaves)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("residual", [False, True])
def test_finite_differences_agree_with_the_fast_block(residual):
    values, _, _ = _values(seed=2, residual=residual)

    def block(*inputs):
        return _block(*inputs)[1]

    with fast.enabled():
        assert gradcheck(block, tuple(_leaves(values)))


@pytest.mark.parametrize("residual", [False, True])
def test_a_taken_derivative_is_applied_when_the_kernels_are_switched_off_before_backward(residual):
    """The gate took GELU's dy/dx in forward; with the compiled kernels off by backward, its NumPy
    path runs and must still multiply dL/dz by it."""
    values, g, _ = _values(seed=5, residual=residual)
    leaves = _leaves(values)
    with fast.enabled():
        _, out = _block(*leaves)
        assert "GELU" not in " ".join(_names(out))
        compiled.set_enabled(False)
        try:
            (out * Tensor(g)).sum().backward()
        finally:
            compiled.set_enabled(True)
    assert_reference_gradients(leaves, values, g)


def test_no_derivative_is_taken_from_a_c_ordered_z():
    """A z in C order (not token-major) goes the generic way, and GELU keeps its own backward."""
    values, g, _ = _values(seed=3)
    values[0] = np.ascontiguousarray(values[0])
    leaves = _leaves(values)
    with fast.enabled():
        _, out = _block(*leaves)
        assert "GELU" in " ".join(_names(out))
        (out * Tensor(g)).sum().backward()
    assert_reference_gradients(leaves, values, g)


def test_an_op_with_a_second_input_that_needs_a_gradient_keeps_its_backward():
    """A derivative offered by an op whose other input needs a gradient too is not taken: that
    gradient comes from the op's own backward, which must still run."""
    from tinymlp.autograd import Function

    class Scale(Function):                      # y = x * s: dL/dx = grad * s, dL/ds = sum(grad * x)
        @staticmethod
        def forward(ctx, x, s):
            ctx.save_for_backward(x, s)
            ctx.elementwise_derivative = np.full_like(x, s)     # laid out like x (and y)
            return x * s

        @staticmethod
        def backward(ctx, grad):
            x, s = ctx.saved_tensors
            return grad * s, np.array((grad * x).sum())

    values, g, _ = _values(seed=4)
    results = []
    for on in (True, False):
        leaves = _leaves(values) + [Tensor(np.array(1.5), requires_grad=True, dtype="float64")]
        with fast.enabled() if on else fast.disabled():
            z = Scale.apply(leaves[0], leaves[-1])
            (F.spatial_gating(z, *leaves[1:5]) * Tensor(g)).sum().backward()
        results.append([t.grad for t in leaves])
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
