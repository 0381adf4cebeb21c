"""What the fast tier's raw CUDA kernels are handed, checked on the CuPy stand-in, which reads a
raw kernel's arguments as a GPU does (``tests/standin_memory.py``): a pointer at unit stride from
the array's first element, a host array refused (or, of size one, taken as an address), a scalar
read as the type the kernel declares.
"""

from __future__ import annotations

import numpy as np
import pytest

import tinymlp
from tinymlp.fast import cuda
from tinymlp.fast.kernels import attention_cuda, loss_cuda
from tinymlp.ops.loss import CrossEntropy

import cupy_standin
from cupy_standin import CUDARuntimeError, emulated_kernel


@pytest.fixture
def emulated(monkeypatch):
    gpu = cupy_standin.install(monkeypatch)
    cupy_standin.emulate(monkeypatch)
    yield gpu
    cupy_standin.clear_kernel_caches()


def _cpu_loss_and_grad(logits, labels, smoothing=0.0):
    x = tinymlp.tensor(logits, requires_grad=True)
    loss = tinymlp.functional.cross_entropy(x, tinymlp.tensor(labels), label_smoothing=smoothing)
    loss.backward()
    return float(loss.data), x.grad


# ============================================================================ the stand-in reads as a GPU
def test_the_standin_reads_a_raw_kernels_pointers_at_unit_stride_and_its_scalars_by_their_bytes(emulated):
    """Below the launchers' checks: what a GPU does with the arguments a launcher would refuse."""
    source = cuda.source(loss_cuda.SOURCE, np.float64)
    forward = emulated_kernel(source, "cross_entropy_forward", np.float64)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 6))
    pairs = rng.integers(0, 6, size=(4, 2))
    p, rows = emulated.empty((4, 6)), emulated.empty(4)

    def loss(y):
        forward((4,), (32,), (emulated.asarray(x), y, p, rows, np.int32(6), np.float64(0.0), np.float64(0.25)))
        return rows.get().sum()

    s = x - x.max(axis=1, keepdims=True)
    lse = np.log(np.exp(s).sum(axis=1))
    right = -(s[np.arange(4), pairs[:, 0]] - lse).mean()
    assert loss(emulated.asarray(np.ascontiguousarray(pairs[:, 0]))) == pytest.approx(right)
    strided = emulated.asarray(pairs)[:, 0]                  # read from its first element at unit stride:
    unit = pairs.reshape(-1)[:4]                             # pairs[0, 0], pairs[0, 1], pairs[1, 0], ...
    assert loss(strided) == pytest.approx(-(s[np.arange(4), unit] - lse).mean())
    with pytest.raises(TypeError, match="Only numpy.ndarrays of size one can be passed by value"):
        loss(pairs[:, 0].copy())                             # a host array: CuPy's TypeError
    one = emulated.empty((1, 6))
    with pytest.raises(CUDARuntimeError, match="illegal memory access"):  # size one: its value as an address
        forward((1,), (32,), (one, np.array([3]), one, emulated.empty(1), np.int32(6), np.float64(0), np.float64(1)))
    # a Python float for a `const T alpha` of float32: the kernel reads 4 of the double's 8 bytes
    source32 = cuda.source(attention_cuda.SOURCE, np.float32)
    softmax = emulated_kernel(source32, "softmax_forward", np.float32)
    s32 = emulated.asarray(np.zeros((1, 3), np.float32) + np.float32([1, 2, 3]))
    softmax((1,), (32,), (s32, np.int32(3), 0.5))            # scale = the low half of 0.5's bits: 0.0
    np.testing.assert_allclose(s32.get(), np.full((1, 3), 1 / 3), rtol=1e-6)


# ============================================================================ the launchers refuse them
def test_every_raw_kernel_launch_refuses_host_strided_mistyped_arrays_and_scalars_with_a_sentence(emulated):
    launch = cuda.kernel(attention_cuda.SOURCE, "softmax_backward", np.float32)
    p = emulated.asarray(np.full((2, 4), 0.25, np.float32))
    ok = (p, p, emulated.empty((2, 4), np.float32), np.int32(4))
    launch((2,), (32,), ok)
    cases = [
        ((p.get(), *ok[1:]), TypeError, r"softmax_backward: p must be a CuPy array on the GPU .* numpy ndarray"),
        ((p, emulated.asarray(np.ones((2, 8), np.float32))[:, ::2], *ok[2:]), ValueError,
         r"softmax_backward: g of shape \(2, 4\) and strides \(32, 8\) is not contiguous; the kernel reads it at "
         "unit stride"),
        ((p, p.astype(np.float64), *ok[2:]), TypeError, "softmax_backward: g must hold float32, got float64"),
        ((*ok[:3], 4), TypeError, r"softmax_backward: width must be a numpy.int32 scalar \(the kernel reads 4 bytes\), "
                                  "got int 4"),
        (ok[:3], TypeError, "kernel softmax_backward takes 4 arguments, got 3"),
    ]
    for args, error, message in cases:
        with pytest.raises(error, match=message):
            launch((2,), (32,), args)


def test_every_raw_kernel_of_the_fast_tier_declares_parameters_the_launcher_knows():
    from tinymlp.fast.kernels import norm_cuda, optim_cuda
    import re
    for module in (attention_cuda, loss_cuda, norm_cuda, optim_cuda):
        for name in re.findall(r'extern "C" __global__ void (\w+)\(', module.SOURCE):
            params = cuda.parameters(module.SOURCE, name, np.float32)
            assert params and all(kind in ("scalar", "contiguous", "rows") for _, _, kind in params)
    kinds = {p: k for p, _, k in cuda.parameters(norm_cuda.SOURCE, "layer_norm_forward", np.float32)}
    assert kinds["x"] == "rows" and kinds["y"] == "contiguous" and kinds["x_stride"] == "scalar"


# ============================================================================ the class ids of the loss
@pytest.mark.parametrize("batch", [1, 5])
def test_class_ids_on_the_host_beside_cuda_logits_are_refused_naming_both_devices(emulated, batch):
    """Batch > 1 was CuPy's TypeError from inside the kernel launch, batch 1 the label used as a
    device address (an illegal access that ends the CUDA context)."""
    rng = np.random.default_rng(batch)
    logits = tinymlp.tensor(rng.standard_normal((batch, 7)).astype(np.float32), device="cuda", requires_grad=True)
    labels = rng.integers(0, 7, size=batch)
    with pytest.raises(RuntimeError, match=r"inputs are on different devices \(cuda, cpu\)"):
        tinymlp.functional.cross_entropy(logits, tinymlp.tensor(labels))          # a CPU tensor
    with pytest.raises(RuntimeError, match="the class ids are on the cpu and the logits on the cuda"):
        CrossEntropy.apply(logits, labels)                                         # a host array, straight in
    loss = tinymlp.functional.cross_entropy(logits, labels)                        # an array: data, uploaded
    np.testing.assert_allclose(float(loss.data.get()), _cpu_loss_and_grad(logits.data.get(), labels)[0], rtol=1e-6)


@pytest.mark.parametrize("layout", ["column of a table", "every other", "int32"])
def test_class_ids_in_any_layout_or_integer_dtype_give_the_cpus_loss_and_gradients_through_the_kernel(emulated,
                                                                                                    layout):
    rng = np.random.default_rng(0)
    host = rng.standard_normal((6, 9)).astype(np.float32)
    table = rng.integers(0, 9, size=(12, 3))
    if layout == "column of a table":
        device_ids, ids = tinymlp.tensor(table[:6], device="cuda")[:, 1], table[:6, 1]
    elif layout == "every other":
        device_ids, ids = tinymlp.tensor(table[:, 2], device="cuda")[::2], table[::2, 2]
    else:
        device_ids, ids = tinymlp.tensor(table[:6, 0].astype(np.int32), device="cuda"), table[:6, 0]
    assert layout == "int32" or not device_ids.data.flags.c_contiguous
    for smoothing in (0.0, 0.1):
        x = tinymlp.tensor(host, device="cuda", requires_grad=True)
        cupy_standin.LAUNCHED.clear()
        loss = tinymlp.functional.cross_entropy(x, device_ids, label_smoothing=smoothing)
        loss.backward()
        assert {"cross_entropy_forward", "cross_entropy_backward"} <= cupy_standin.LAUNCHED
        want_loss, want_grad = _cpu_loss_and_grad(host, ids, smoothing)
        np.testing.assert_allclose(float(loss.data.get()), want_loss, rtol=1e-5)
        np.testing.assert_allclose(x.grad.get(), want_grad.astype(np.float32), rtol=1e-5, atol=1e-7)


def test_the_loss_kernels_refuse_class_ids_of_the_wrong_length(emulated):
    x = emulated.asarray(np.zeros((4, 3), np.float32))
    with pytest.raises(ValueError, match=r"cross_entropy_forward: expected 4 class ids, one per row of the logits, "
                                         r"got an array of shape \(3,\)"):
        loss_cuda.cross_entropy_forward(x, emulated.asarray(np.zeros(3, np.int64)), 0.0)
