"""A bias left pending: the fast Linear's output without its bias, added by the next op or on first read.

The compiled GELU adds it in its own pass (GELU(x W + b) in one pass over x W); every other
reader of the output (an op, ``.data``, ``numpy()``, printing, indexing, an in-place write,
another thread) gets the values with the bias, added once, as it was at forward.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import tinymlp.functional as F
from tinymlp import Tensor, fast, no_grad
from tinymlp.fast import compiled
from tinymlp.fast.engine import PendingBias

pytestmark = pytest.mark.skipif(not compiled.available(), reason="the bias is left pending where numba runs")


def is_pending(t):
    """Whether ``t`` holds its op's bias unadded."""
    return isinstance(t, PendingBias) and t.bias is not None


def _linear(seed=0, shape=(3, 5, 4), d_out=6):
    rng = np.random.default_rng(seed)
    x = Tensor(rng.standard_normal(shape), requires_grad=True, dtype="float64")
    w = Tensor(rng.standard_normal((shape[-1], d_out)), requires_grad=True, dtype="float64")
    b = Tensor(rng.standard_normal(d_out), requires_grad=True, dtype="float64")
    return x, w, b, x.data @ w.data + b.data


def _pending_output(**kw):
    x, w, b, expected = _linear(**kw)
    with fast.enabled():
        h = F.linear(x, w, b)
    assert is_pending(h), "the fast Linear added its bias (nothing to test)"
    return h, expected, (x, w, b)


READERS = {
    ".data": lambda h: h.data,
    "numpy()": lambda h: h.numpy(),
    "an op": lambda h: (h * 1.0).data,
    "x op x": lambda h: (h + h).data / 2,
    "a view": lambda h: h.reshape(-1).data.reshape(h.shape),
    "indexing": lambda h: np.stack([h[i].data for i in range(h.shape[0])]),
    "detach": lambda h: h.detach().data,
    "np.asarray": lambda h: np.asarray(h),
}


@pytest.mark.parametrize("reader", READERS)
def test_every_reader_gets_the_output_with_its_bias(reader):
    h, expected, _ = _pending_output()
    np.testing.assert_allclose(READERS[reader](h), expected, rtol=1e-12, atol=1e-12)
    assert not is_pending(h)
    np.testing.assert_allclose(h.data, expected, rtol=1e-12, atol=1e-12)        # added once


def test_item_repr_and_in_place_writes_see_the_bias():
    h, expected, _ = _pending_output(shape=(1, 1), d_out=1)
    assert h.item() == pytest.approx(expected.item())
    h, expected, _ = _pending_output()
    assert f"{expected[0, 0, 0]:.4f}"[:5] in repr(h)
    h, expected, _ = _pending_output()
    with no_grad():
        h[0] = 0.0
    expected[0] = 0.0
    np.testing.assert_allclose(h.data, expected, rtol=1e-12, atol=1e-12)
    h, expected, _ = _pending_output()
    with no_grad():
        h += 1.0
    np.testing.assert_allclose(h.data, expected + 1.0, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layout", ["C", "token-major", "token mixing"])
def test_gelu_takes_the_bias_in_its_own_pass_and_the_gradients_are_the_reference(layout):
    rng = np.random.default_rng(1)
    x0 = rng.standard_normal((4, 5, 3))
    if layout != "C":                         # (B, S, C) seen, (S, B, C) in memory
        x0 = np.ascontiguousarray(x0.transpose(1, 0, 2)).transpose(1, 0, 2)
    w0, b0 = rng.standard_normal((5 if layout == "token mixing" else 3, 7)), rng.standard_normal(7)
    g = rng.standard_normal((4, 3, 7) if layout == "token mixing" else (4, 5, 7))
    results = []
    for on in (True, False):
        x, w, b = (Tensor(a, requires_grad=True, dtype="float64") for a in (x0, w0, b0))
        with fast.enabled() if on else fast.disabled():
            h = F.linear(x.swapaxes(1, 2) if layout == "token mixing" else x, w, b)
            if on:
                assert is_pending(h)
            y = F.gelu(h)
            if on:
                assert is_pending(h), "GELU settled the bias instead of taking it"
            y.backward(g)
        results.append([y.data, h.data, x.grad, w.grad, b.grad])
    for fast_value, reference in zip(*results):
        np.testing.assert_allclose(fast_value, reference, rtol=1e-12, atol=1e-12)


def test_the_bias_is_the_one_forward_saw():
    """An optimizer step between forward and the first read does not change the output."""
    h, expected, (_, _, b) = _pending_output()
    with no_grad():
        b -= 1.0
    np.testing.assert_allclose(h.data, expected, rtol=1e-12, atol=1e-12)


def test_two_threads_reading_at_once_add_the_bias_once():
    for _ in range(20):
        h, expected, _ = _pending_output(shape=(64, 64), d_out=64)
        start = threading.Barrier(2)
        seen = []

        def read(h=h, start=start, seen=seen):
            start.wait()
            seen.append(h.data)

        threads = [threading.Thread(target=read) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        np.testing.assert_allclose(h.data, expected, rtol=1e-12, atol=1e-12)


def _token_major(a):
    return np.ascontiguousarray(a.transpose(1, 0, 2)).transpose(1, 0, 2)


def _step(layouts, which, dtype, g):
    """x + linear(h) (or the other order, or two Linears summed) with the fast tier on and off:
    ``[out, x.grad, h.grad, w.grad, b.grad]`` for each, and whether the bias was taken."""
    rng = np.random.default_rng(3)
    x0 = rng.standard_normal((4, 5, 6)).astype(dtype)
    h0 = rng.standard_normal((4, 5, 3)).astype(dtype)
    x0 = _token_major(x0) if layouts[0] == "token-major" else x0
    h0 = _token_major(h0) if layouts[1] == "token-major" else h0
    w0, b0 = rng.standard_normal((3, 6)).astype(dtype), rng.standard_normal(6).astype(dtype)
    results, taken = [], []
    for on in (True, False):
        x, h, w, b = (Tensor(a, requires_grad=True, dtype=dtype) for a in (x0, h0, w0, b0))
        with fast.enabled() if on else fast.disabled():
            y = F.linear(h, w, b)
            other = F.linear(x, Tensor(np.eye(6), dtype=dtype), b * 2.0) if which == "both" else x
            out = y + other if which == "linear first" else other + y
            taken.append(is_pending(y))
            out.backward(g)
        results.append([out.data, x.grad, h.grad, w.grad, b.grad])
    return results, taken[0]


@pytest.mark.parametrize("which", ["linear first", "residual first", "both"])
@pytest.mark.parametrize("layouts", [("C", "C"), ("token-major", "token-major"), ("C", "token-major")])
def test_the_residual_sum_takes_the_bias_of_either_input(which, layouts):
    """x + (h W + b): the sum adds the pending b in its own pass (one pass, where it was two) on
    either side; where the layouts differ it is added first. Values and gradients: the reference's."""
    g = np.random.default_rng(4).standard_normal((4, 5, 6))
    results, taken = _step(layouts, which, "float64", g)
    for fast_value, reference in zip(*results):
        np.testing.assert_allclose(fast_value, reference, rtol=1e-12, atol=1e-12)
    if layouts[0] == layouts[1]:
        assert taken, "the sum settled the bias instead of taking it"


@pytest.mark.parametrize("layout", ["C", "token-major"])
def test_the_residual_sum_with_the_bias_rounds_as_the_reference(layout):
    """float32: (h W + b) + x in one pass gives the two NumPy additions' result to the bit."""
    g = np.ones((4, 5, 6), dtype=np.float32)
    for which in ("linear first", "residual first"):
        results, taken = _step((layout, layout), which, "float32", g)
        assert taken
        np.testing.assert_array_equal(results[0][0], results[1][0])


def test_a_sum_with_a_number_or_a_broadcast_array_has_the_bias():
    h, expected, _ = _pending_output()
    np.testing.assert_allclose((h + 1.0).data, expected + 1.0, rtol=1e-12, atol=1e-12)
    h, expected, _ = _pending_output()
    row = np.arange(6.0)
    np.testing.assert_allclose((h + Tensor(row)).data, expected + row, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose((Tensor(row) + h).data, expected + row, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(h.data, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("z_layout", ["token-major", "C"])
def test_the_gating_unit_takes_its_residuals_bias(z_layout):
    """aMLP: the gate residual is the attention's output projection, its bias pending; the SGU
    adds it to its (S, e) shift (token-major z) or to a copy of the residual, never the caller's array."""
    rng = np.random.default_rng(5)
    B, S, e = 3, 4, 5
    z0 = rng.standard_normal((B, S, 2 * e))
    z0 = _token_major(z0) if z_layout == "token-major" else z0
    a0 = _token_major(rng.standard_normal((B, S, 2)))
    params0 = [rng.standard_normal((S, S)), rng.standard_normal(S), rng.standard_normal(e), rng.standard_normal(e),
               rng.standard_normal((2, e)), rng.standard_normal(e)]
    g = rng.standard_normal((B, S, e))
    results, taken = [], []
    for on in (True, False):
        z, a, W, b, gamma, beta, wo, bo = (Tensor(v, requires_grad=True, dtype="float64") for v in [z0, a0] + params0)
        with fast.enabled() if on else fast.disabled():
            residual = F.linear(a, wo, bo)
            out = F.spatial_gating(z, W, b, gamma, beta, gate_residual=residual)
            taken.append(is_pending(residual))
            out.backward(g)
            results.append([out.data, residual.data] + [t.grad for t in (z, a, W, b, gamma, beta, wo, bo)])
    assert taken[0], "the SGU settled its residual's bias instead of taking it"
    for fast_value, reference in zip(*results):
        np.testing.assert_allclose(fast_value, reference, rtol=1e-10, atol=1e-12)
