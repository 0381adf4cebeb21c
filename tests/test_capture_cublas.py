"""``tinymlp/fast/cublas.py`` (products a captured step can issue) on the CuPy stand-in, whose
libcublas (``tests/standin_cublas.py``) reads device memory by address as cuBLAS does. What this
cannot show (the real library's numbers, its speed, capture on a GPU) is checked by
``benchmarks/gpu_cublas_check.py`` on a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from tinymlp.fast import cublas

import cupy_standin
from standin_cublas import emulate_cublas


@pytest.fixture
def gpu(monkeypatch):
    cp = cupy_standin.install(monkeypatch)
    fake = emulate_cublas(monkeypatch)
    yield cp, fake
    cupy_standin.clear_kernel_caches()


LAYOUTS = {
    "2-D": lambda r: (r((5, 3)), r((3, 4))),
    "a transposed": lambda r: (r((3, 5)).T, r((3, 4))),
    "b transposed": lambda r: (r((5, 3)), r((4, 3)).T),
    "both transposed, a row of a wider array": lambda r: (r((3, 8))[:, 1:6].T, r((4, 3)).T),
    "batched": lambda r: (r((2, 5, 3)), r((2, 3, 4))),
    "b broadcast over the batch": lambda r: (r((2, 5, 3)), r((3, 4))),
    "token-major batch (a swapaxes view)": lambda r: (r((5, 2, 3)).swapaxes(0, 1), r((2, 3, 4))),
    "batch of batches": lambda r: (r((2, 3, 5, 3)), r((3, 4))),
    "one column": lambda r: (r((5, 3)), r((3, 1))),
    "empty inner axis": lambda r: (r((5, 0)), r((0, 4))),
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_cublas_matmul_is_numpys_product_for_every_layout_it_takes(gpu, layout, dtype):
    cp, fake = gpu
    host, device = np.random.default_rng(0), np.random.default_rng(0)
    a, b = LAYOUTS[layout](lambda shape: host.standard_normal(shape).astype(dtype))
    da, db = LAYOUTS[layout](lambda shape: cp.asarray(device.standard_normal(shape).astype(dtype)))
    assert da.strides == a.strides and db.strides == b.strides
    assert cublas.supports(da, db)
    got = cublas.matmul(da, db)
    np.testing.assert_allclose(got.get(), a @ b, rtol=1e-5 if dtype == "float32" else 1e-12, atol=1e-6)
    assert got.flags.c_contiguous and fake.calls == (0 if layout == "empty inner axis" else 1)


def test_cublas_matmul_refuses_what_one_call_cannot_read_with_a_sentence(gpu):
    cp, _ = gpu
    x = cp.asarray(np.ones((6, 6), np.float32))
    with pytest.raises(ValueError, match="layouts .* that cuBLAS cannot read in one call"):
        cublas.matmul(x[::2, ::2], x[:3, :3])
    with pytest.raises(ValueError, match="do not chain"):
        cublas.matmul(x[:2, :3], x[:2, :3])
    with pytest.raises(ValueError, match="float32 or float64 arrays of one dtype"):
        cublas.matmul(x, x.astype(np.float64))
    with pytest.raises(TypeError, match="takes CuPy arrays"):
        cublas.matmul(np.ones((2, 2), np.float32), x[:2, :2])


def test_a_cublas_product_is_captured_and_replays_on_new_inputs_where_cupys_is_refused(gpu):
    cp, _ = gpu
    rng = np.random.default_rng(1)
    a = cp.asarray(rng.standard_normal((2, 4, 3)).astype(np.float32))
    w = cp.asarray(rng.standard_normal((5, 3)).astype(np.float32))
    cublas.matmul(a, w.T)                                   # warm-up: the handle and its workspace
    stream = cp.cuda.Stream(non_blocking=True)
    with stream, cp.cuda.using_allocator(cp.cuda.MemoryPool().malloc):
        stream.begin_capture()
        try:
            with pytest.raises(NotImplementedError, match="cuBLAS"):
                cp.matmul(a, w.T)
            y = cublas.matmul(a, w.T)
        finally:
            graph = stream.end_capture()
    for _ in range(2):
        host = rng.standard_normal((2, 4, 3)).astype(np.float32)
        a.set(host)
        graph.launch()
        np.testing.assert_allclose(y.get(), host @ w.get().T, rtol=1e-5, atol=1e-6)


OUTS = {
    "a third of a token-major array (self-attention's dq)":
        lambda cp, m, n: cp.empty((4, 2, 3 * n), np.float32).swapaxes(0, 1)[..., n:2 * n][:, :m],
    "laid out as a transpose": lambda cp, m, n: cp.empty((2, n, m), np.float32).swapaxes(1, 2),
    "C order": lambda cp, m, n: cp.empty((2, m, n), np.float32),
}


@pytest.mark.parametrize("out", list(OUTS))
def test_cublas_matmul_writes_into_out_in_place(gpu, out):
    cp, fake = gpu
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((2, 4, 3)).astype(np.float32), rng.standard_normal((2, 3, 5)).astype(np.float32)
    into = OUTS[out](cp, 4, 5)
    assert cublas.supports(cp.asarray(a), cp.asarray(b), into)
    got = cublas.product(cp.asarray(a), cp.asarray(b), out=into)
    assert got is into and fake.calls == 1
    np.testing.assert_allclose(into.get(), a @ b, rtol=1e-5, atol=1e-6)


def test_product_reads_1d_operands_and_copies_what_one_call_cannot_read(gpu):
    """A bias gradient 1^T G (a 1-D operand), and ViT's per-head products, whose two batch axes
    have strides that do not collapse to one: copied first, then one call (as eager as captured)."""
    cp, fake = gpu
    rng = np.random.default_rng(3)
    g = rng.standard_normal((6, 5)).astype(np.float32)
    ones = np.ones(6, np.float32)
    np.testing.assert_allclose(cublas.product(cp.asarray(ones), cp.asarray(g)).get(), ones @ g, rtol=1e-5)
    np.testing.assert_allclose(cublas.product(cp.asarray(g), cp.asarray(ones[:5])).get(), g @ ones[:5], rtol=1e-5)
    qkv = rng.standard_normal((2, 7, 3, 2, 4)).astype(np.float32)          # (B, S, q/k/v, heads, d)
    q, k = (cp.asarray(qkv)[:, :, i].transpose(0, 2, 1, 3) for i in (0, 1))  # (B, heads, S, d) views
    assert not cublas.supports(q, k.swapaxes(-1, -2))
    want = qkv[:, :, 0].transpose(0, 2, 1, 3) @ qkv[:, :, 1].transpose(0, 2, 3, 1)
    np.testing.assert_allclose(cublas.product(q, k.swapaxes(-1, -2)).get(), want, rtol=1e-5, atol=1e-6)
    assert fake.calls == 3
