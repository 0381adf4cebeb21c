"""Softmax backward on CUDA: one thread block per row, the row's dot product and the update in
one launch (the fast ``Softmax`` and ``Attention`` call it for dL/dS from dL/dP).

The formula, dL/dx = p * (g - rowsum(g * p)), is derived in ``tinymlp/ops/attention.py``.
"""

from __future__ import annotations

import numpy as np

from .. import cuda

__all__ = ["SOURCE", "softmax_backward"]

SOURCE = r"""// Softmax backward of one row per block, all contiguous (rows, width):
//   dx = p * (g - sum_j g_j p_j).   dx may alias g (same-index read before write).
extern "C" __global__ void softmax_backward(
        const T* p, const T* g, T* dx, const int width) {
    __shared__ T shared[33];
    const long long row = blockIdx.x;
    const T* pr = p + row * width;
    const T* gr = g + row * width;
    T s = 0;
    for (int j = threadIdx.x; j < width; j += blockDim.x) s += gr[j] * pr[j];
    const T dot = block_sum(s, shared);
    T* dr = dx + row * width;
    for (int j = threadIdx.x; j < width; j += blockDim.x) dr[j] = pr[j] * (gr[j] - dot);
}
"""


def softmax_backward(p, g, out=None):
    """Softmax backward along the last axis: ``p * (g - rowsum(g * p))`` (p is softmax's output).

    ``out`` may be ``g`` itself (the attention backward updates dL/dP in place).
    """
    cp = cuda.cupy()
    cuda.check("softmax_backward", p, g)
    d = p.shape[-1]
    p, g = cuda.contiguous_rows(p), cuda.contiguous_rows(g)
    if out is None or not out.flags.c_contiguous:
        dx = cp.empty(p.shape, dtype=p.dtype)
    else:
        dx = out
    n = p.size // d if d else 0
    if n and d:
        cuda.kernel(SOURCE, "softmax_backward", p.dtype)((n,), (cuda.block(d),), (p, g, dx, np.int32(d)))
    if out is not None and dx is not out:
        out[...] = dx
        return out
    return dx


@cuda.self_test
def _self_test(dtype):
    rng = np.random.default_rng(0)
    p = rng.random((3, 37))
    p /= p.sum(axis=1, keepdims=True)
    g = rng.standard_normal((3, 37))
    cp = cuda.cupy()
    got = softmax_backward(cp.asarray(p, dtype=dtype), cp.asarray(g, dtype=dtype))
    return [("the softmax backward", got, p * (g - (g * p).sum(axis=1, keepdims=True)))]
