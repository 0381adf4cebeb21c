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

pytestmark = pytest.mark.skipif(not compiled.available(), reason="the bias is left pending where numba runs")


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
    assert h._pending is not None, "the fast Linear added its bias (nothing to test)"
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
    assert h._pending is None
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
                assert h._pending is not None
            y = F.gelu(h)
            if on:
                assert h._pending is not None, "GELU settled the bias instead of taking it"
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
