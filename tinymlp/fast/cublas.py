"""Matrix products a captured CUDA step can issue: cuBLAS called through ctypes on a handle of ours.

Every product of CuPy (``matmul``, ``dot``, ``tensordot``, ``einsum``) goes through
``cupy_backends.cuda.libs.cublas``, whose routines all set the handle's stream first, and that
``setStream`` raises NotImplementedError while the stream is captured (CuPy 14; cupy/cupy#6290,
open). cuBLAS itself can be captured (its documentation, "CUDA Graphs Support") when it does not
allocate during capture, i.e. runs on a workspace the caller gave it (``cublasSetWorkspace``),
and with alpha and beta on the host (their values are then kept in the graph: 1 and 0 here).

So this module loads the libcublas that CuPy loaded (its CUDA extras install it) and calls four
functions of it: ``cublasCreate_v2`` (a handle of our own, CuPy's is left alone),
``cublasSetStream_v2`` and ``cublasSetWorkspace_v2`` (the current stream, a 32 MiB workspace
allocated once, before any capture), and ``cublasGemmStridedBatchedEx``. TF32 stays off: the
handle keeps CUBLAS_DEFAULT_MATH and the products compute in CUBLAS_COMPUTE_32F (float32) or
CUBLAS_COMPUTE_64F, as ``cupy.matmul`` does unless CUPY_TF32=1.

``matmul(a, b, out=None)`` is ``a @ b`` for CuPy arrays (..., m, k) @ (..., k, n) of one float
dtype whose matrices have unit stride along one axis (C order, or a transposed view) and whose
batch axes collapse to one stride (broadcast ones included): one GEMM call, into a new
C-contiguous array or into ``out`` (a view such as a third of a token-major array is written in
place). A row-major C = A B is the column-major C^T = B^T A^T, so B goes first. Anything else is
refused with a sentence (``supports`` says beforehand).

``product(a, b, out=None)`` is what the fast tier's CUDA ops call (``CudaLinear``, the CUDA
attention and spatial gating): this binding where it loads, else ``cupy.matmul``. Operands it
cannot read in one call (ViT's heads: two batch strides) are first copied, eager or captured
alike (a copy kernel can be captured, CuPy's product cannot; the same copies give the same
sums). ``TINYMLP_CUBLAS=0`` in the environment (read at import) leaves every product to
``cupy.matmul`` (and makes the training step uncapturable). Not yet checked on a GPU:
``benchmarks/gpu_cublas_check.py`` compares the binding with ``cupy.matmul`` and replays it in a
graph; ``tests/test_cuda.py`` runs the models' steps through it.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os

import numpy as np

from . import cuda

__all__ = ["COMPUTE", "WORKSPACE", "available", "library", "matmul", "product", "set_enabled", "supports"]

OP_N, OP_T = 0, 1
DATA = {np.dtype(np.float32): 0, np.dtype(np.float64): 1}             # CUDA_R_32F, CUDA_R_64F
COMPUTE = {np.dtype(np.float32): 68, np.dtype(np.float64): 70}        # CUBLAS_COMPUTE_32F, _64F: no TF32
GEMM_DEFAULT = -1
WORKSPACE = 32 << 20
"""Bytes of the handle's workspace (what cuBLAS advises for Hopper)."""
_enabled = os.environ.get("TINYMLP_CUBLAS", "1").strip().lower() not in ("0", "false", "no", "off")


def library():
    """The libcublas CuPy loaded (found in this process's mapped files), else the first that loads."""
    import cupy_backends.cuda.libs.cublas  # noqa: F401  (CuPy loads its libcublas)
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = sorted({line.split()[-1] for line in maps if "libcublas.so" in line and "Lt" not in line})
    except OSError:
        paths = []
    for name in paths + ["libcublas.so.13", "libcublas.so.12", "libcublas.so"]:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise OSError("libcublas could not be loaded: install CuPy with its CUDA extras (cupy-cuda13x[ctk])")


class _Handle:
    """A cuBLAS handle of our own, its workspace, and the stream it was last given."""

    def __init__(self, lib):
        self.lib, self.handle, self.stream = lib, ctypes.c_void_p(), None
        _check(lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate_v2")
        self.workspace = cuda.cupy().empty(WORKSPACE, dtype=np.uint8)

    def on(self, stream_ptr):
        """The handle on the current stream (setting the stream resets the workspace: set both)."""
        if stream_ptr != self.stream:
            _check(self.lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(stream_ptr)), "cublasSetStream_v2")
            _check(self.lib.cublasSetWorkspace_v2(self.handle, ctypes.c_void_p(self.workspace.data.ptr),
                                                  ctypes.c_size_t(WORKSPACE)), "cublasSetWorkspace_v2")
            self.stream = stream_ptr
        return self.handle


@functools.cache
def _handle():
    return _Handle(library())


@functools.cache
def _loaded():
    """The handle, or None where libcublas does not load (then ``product`` takes CuPy's)."""
    try:
        return _handle()
    except (ImportError, OSError, AttributeError, RuntimeError):
        return None


def available() -> bool:
    """Whether ``product`` calls this binding: it is enabled and libcublas loads (a handle made)."""
    return _enabled and _loaded() is not None


def set_enabled(on: bool) -> None:
    """Use this binding for ``product`` (True, the default unless ``TINYMLP_CUBLAS=0``) or
    ``cupy.matmul`` (False: e.g. to time what the binding saves without graphs)."""
    global _enabled
    _enabled = bool(on)


def _check(status, what):
    if status != 0:
        raise RuntimeError(f"{what} failed with cuBLAS status {status}")


def _matrix(shape, strides, item):
    """(op, leading dimension) of a row-major (r, c) matrix with ``strides`` in bytes, read by
    cuBLAS as column-major storage, or None: unit stride along neither axis."""
    (r, c), (sr, sc) = shape, (strides[0] // item, strides[1] // item)
    if r == 0 or c == 0:
        return OP_N, max(1, c)                  # nothing is read
    if c == 1:
        sc = 1
    if r == 1:
        sr = max(sr, c) if sc == 1 else 1
    if sc == 1 and sr >= max(1, c):
        return OP_N, sr                         # stored as the (c, r) transpose, column-major
    if sr == 1 and sc >= max(1, r):
        return OP_T, sc
    return None


def _batch(x, batch_shape, item):
    """One stride (in elements) for x's batch axes broadcast to ``batch_shape``, or None."""
    lead = x.ndim - 2
    view = x.reshape((1,) * (len(batch_shape) - lead) + x.shape) if lead < len(batch_shape) else x
    strides = [0 if n == 1 else s // item for n, s in zip(view.shape[:-2], view.strides[:-2])]
    dims = [(n, s) for n, s in zip(batch_shape, strides) if n != 1]
    for (_, outer), (n_inner, inner) in zip(dims, dims[1:]):
        if outer != inner * n_inner:
            return None
    return dims[-1][1] if dims else 0


def _plan(a, b, out=None):
    if not (a.ndim >= 2 and b.ndim >= 2 and a.dtype == b.dtype and np.dtype(a.dtype) in DATA):
        return "two float32 or float64 arrays of one dtype, each at least 2-D"
    if a.shape[-1] != b.shape[-2]:
        return f"shapes {a.shape} and {b.shape} do not chain: a's last axis must be b's second to last"
    item = a.itemsize
    try:
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        return f"batch shapes {a.shape[:-2]} and {b.shape[:-2]} do not broadcast"
    ma, mb = _matrix(a.shape[-2:], a.strides[-2:], item), _matrix(b.shape[-2:], b.strides[-2:], item)
    sa, sb = _batch(a, batch, item), _batch(b, batch, item)
    if None in (ma, mb, sa, sb):
        return f"layouts (strides {a.strides} and {b.strides}) that cuBLAS cannot read in one call"
    mc = sc = None
    if out is not None:
        if out.shape != batch + (a.shape[-2], b.shape[-1]) or out.dtype != a.dtype:
            return f"out of shape {out.shape} and dtype {out.dtype} for a product of shape " \
                   f"{batch + (a.shape[-2], b.shape[-1])} and dtype {a.dtype}"
        mc, sc = _matrix(out.shape[-2:], out.strides[-2:], item), _batch(out, batch, item)
        if mc is None or mc[0] != OP_N or sc is None or (sc == 0 and math.prod(batch) > 1):
            return f"out with strides {out.strides}, which cuBLAS cannot write in one call"
    return batch, ma, mb, sa, sb, mc, sc


def _t(x):
    return x.swapaxes(-1, -2)


def _transposed(out):
    """Whether ``out``'s matrices are laid out as transposes (unit stride down a column): then
    ``matmul`` writes out^T = b^T a^T."""
    return out is not None and out.ndim >= 2 and out.strides[-2] == out.itemsize and min(out.shape[-2:]) > 1


def supports(a, b, out=None) -> bool:
    """Whether ``matmul(a, b, out)`` takes these arrays."""
    if _transposed(out):
        a, b, out = _t(b), _t(a), _t(out)
    return not isinstance(_plan(a, b, out), str)


def matmul(a, b, out=None):
    """``a @ b`` in one ``cublasGemmStridedBatchedEx`` call on the current stream (capturable),
    into a new C-contiguous array or into ``out``."""
    cp = cuda.cupy()
    if not (isinstance(a, cp.ndarray) and isinstance(b, cp.ndarray)):
        raise TypeError(f"cublas.matmul takes CuPy arrays, got {type(a).__name__} and {type(b).__name__}")
    if _transposed(out):
        matmul(_t(b), _t(a), _t(out))
        return out
    plan = _plan(a, b, out)
    if isinstance(plan, str):
        raise ValueError(f"cublas.matmul: {plan}")
    return _gemm(a, b, out, plan)


def _gemm(a, b, out, plan):
    cp = cuda.cupy()
    batch, (op_a, ld_a), (op_b, ld_b), stride_a, stride_b, mc, stride_c = plan
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    if out is None:
        out = cp.empty(batch + (m, n), dtype=a.dtype)
        ld_c, stride_c = n, m * n
    else:
        ld_c = mc[1]
    count = math.prod(batch)
    if out.size == 0:
        return out
    if k == 0:
        out[...] = 0
        return out
    handle = _handle()
    scalar = ctypes.c_float if a.dtype == np.float32 else ctypes.c_double
    alpha, beta = scalar(1.0), scalar(0.0)
    data = DATA[np.dtype(a.dtype)]
    _check(handle.lib.cublasGemmStridedBatchedEx(
        handle.on(cp.cuda.get_current_stream().ptr), op_b, op_a, n, m, k, ctypes.byref(alpha),
        ctypes.c_void_p(b.data.ptr), data, ld_b, ctypes.c_longlong(stride_b),
        ctypes.c_void_p(a.data.ptr), data, ld_a, ctypes.c_longlong(stride_a), ctypes.byref(beta),
        ctypes.c_void_p(out.data.ptr), data, ld_c, ctypes.c_longlong(stride_c), count,
        COMPUTE[np.dtype(a.dtype)], GEMM_DEFAULT), "cublasGemmStridedBatchedEx")
    return out


def product(a, b, out=None):
    """``numpy.matmul(a, b, out=out)`` for the fast tier's CUDA ops: through this binding where it
    is ``available`` (a 1-D operand as NumPy reads it), else ``cupy.matmul``; see the module
    docstring."""
    cp = cuda.cupy()
    if not (available() and a.ndim and b.ndim and type(a) is type(b) is cp.ndarray):
        return cp.matmul(a, b, out=out)
    if a.ndim == 1 or b.ndim == 1:                       # a row (or a column) of one product
        result = product(a[None, :] if a.ndim == 1 else a, b[:, None] if b.ndim == 1 else b)
        result = result[..., 0, :] if a.ndim == 1 else result
        result = result[..., 0] if b.ndim == 1 else result
        if out is None:
            return result
        out[...] = result
        return out
    if _transposed(out):
        product(_t(b), _t(a), _t(out))
        return out
    plan = _plan(a, b, out)
    if not isinstance(plan, str):                       # the usual case: one call, planned once
        return _gemm(a, b, out, plan)
    if not supports(a, b):                              # (the same copies eager and captured: the same sums)
        a, b = cp.ascontiguousarray(a), cp.ascontiguousarray(b)
    if out is not None and not supports(a, b, out):
        out[...] = matmul(a, b)                         # an out cuBLAS cannot write: a copy into it
        return out
    return matmul(a, b, out)
