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
