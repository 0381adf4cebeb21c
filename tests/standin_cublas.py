"""The libcublas that ``tinymlp/fast/cublas.py`` binds, in NumPy, for the CuPy stand-in.

``emulate_cublas(monkeypatch)`` makes ``cublas.library()`` return ``FakeCublas``: the four
functions the binding calls, reading and writing device memory by address as cuBLAS does
(column-major matrices with a leading dimension, a stride between the matrices of a batch) and
checking what cuBLAS or a captured graph would reject: a leading dimension too small (status 7,
CUBLAS_STATUS_INVALID_VALUE), a read past an allocation (the GPU's illegal address), TF32 or any
compute type other than CUBLAS_COMPUTE_32F / 64F for the data type, a call on another stream
than the current one, and a call during capture on a handle without a workspace of its own
(cuBLAS would allocate one inside the graph). Allowed during capture, unlike CuPy's products: a
call then is recorded for the graph, as every device operation of the stand-in.
"""

from __future__ import annotations

import numpy as np

import standin_capture as _capture
from standin_memory import memory_at, take

INVALID_VALUE = 7
DTYPES = {0: np.float32, 1: np.float64}
COMPUTE = {0: 68, 1: 70}


class FakeCublas:
    def __init__(self):
        self.handles, self.calls = {}, 0

    def cublasCreate_v2(self, handle_ref):
        handle = len(self.handles) + 1
        self.handles[handle] = {"stream": 0, "workspace": False}
        handle_ref._obj.value = handle
        return 0

    def cublasSetStream_v2(self, handle, stream):
        state = self.handles[handle.value]
        state["stream"], state["workspace"] = stream.value or 0, False    # a new stream resets the workspace
        return 0

    def cublasSetWorkspace_v2(self, handle, ptr, size):
        memory_at(ptr.value, np.uint8)                      # a live allocation
        self.handles[handle.value]["workspace"] = size.value > 0
        return 0

    def cublasGemmStridedBatchedEx(self, handle, op_a, op_b, m, n, k, alpha, a, a_type, lda, stride_a,
                                   b, b_type, ldb, stride_b, beta, c, c_type, ldc, stride_c, count, compute, algo):
        state = self.handles[handle.value]
        graph = _capture.active()
        assert state["stream"] == _capture.get_current_stream().ptr, "cuBLAS called on another stream than the current"
        if graph is not None:
            assert state["workspace"], "cuBLAS would allocate its workspace during capture: set one first"
        assert a_type == b_type == c_type and compute == COMPUTE[a_type], f"compute {compute}, not {COMPUTE[a_type]}"
        dtype = np.dtype(DTYPES[a_type])
        rows_a, rows_b = (m if op_a == 0 else k), (k if op_b == 0 else n)
        if lda < max(1, rows_a) or ldb < max(1, rows_b) or ldc < max(1, m) or min(m, n, k, count) < 0:
            return INVALID_VALUE
        a_mem, b_mem, c_mem = (memory_at(p.value, dtype) for p in (a, b, c))
        alpha_v, beta_v = alpha._obj.value, beta._obj.value

        def column_major(flat, rows, cols, ld, stride, what):
            take(flat, (count - 1) * stride + (cols - 1) * ld + rows, what)
            item = flat.itemsize
            return np.lib.stride_tricks.as_strided(flat, (count, rows, cols), (stride * item, item, ld * item))

        def gemm(a_mem, b_mem, c_mem):
            A = column_major(a_mem, rows_a, k if op_a == 0 else m, lda, stride_a.value, "A")
            B = column_major(b_mem, rows_b, n if op_b == 0 else k, ldb, stride_b.value, "B")
            C = column_major(c_mem, m, n, ldc, stride_c.value, "C")
            opa = A if op_a == 0 else A.transpose(0, 2, 1)
            opb = B if op_b == 0 else B.transpose(0, 2, 1)
            C[...] = alpha_v * np.matmul(opa, opb) + (beta_v * C if beta_v else 0)

        self.calls += 1
        from cupy_standin import OPS
        OPS.record("cublas gemm")
        if graph is not None:
            graph.record(gemm, a_mem, b_mem, c_mem)
        else:
            gemm(a_mem, b_mem, c_mem)
        return 0


def emulate_cublas(monkeypatch):
    """``tinymlp.fast.cublas`` on the stand-in: its library is ``FakeCublas`` (returned)."""
    from tinymlp.fast import cublas
    fake = FakeCublas()
    monkeypatch.setattr(cublas, "library", lambda: fake)
    cublas._handle.cache_clear()
    cublas._loaded.cache_clear()
    return fake
