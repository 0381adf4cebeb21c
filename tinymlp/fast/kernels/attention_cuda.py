"""Softmax on CUDA, one thread block per row: the forward (the row's maximum, the exponentials,
their sum and the division in one launch, with the attention's 1/sqrt(d) scale applied on the
way), and the backward (the row's dot product and the update in one launch). The fast
``Softmax`` and ``Attention`` call them.

The formulas, p = exp(s - max s) / sum exp(s - max s) and dL/ds = p * (g - rowsum(g * p)), are
derived in ``tinymlp/ops/attention.py``.
"""

from __future__ import annotations

import numpy as np

from .. import cuda

__all__ = ["SOURCE", "softmax_backward", "softmax_forward"]

SOURCE = r"""// Softmax forward of one row per block, in place: s <- softmax(scale * s) along the row
// (contiguous (rows, width)): m = max_j scale s_j, e_j = exp(scale s_j - m), p_j = e_j / sum e.
// Each thread writes only the elements it read.
extern "C" __global__ void softmax_forward(T* s, const int width, const T scale) {
    __shared__ T shared[33];
    const long long row = blockIdx.x;
    T* sr = s + row * width;
    T m = lowest_t(T(0));
    for (int j = threadIdx.x; j < width; j += blockDim.x) {
        const T v = sr[j] * scale;
        m = v > m ? v : m;
    }
    m = block_max(m, shared, lowest_t(T(0)));
    T z = 0;
    for (int j = threadIdx.x; j < width; j += blockDim.x) {
        const T e = exp_t(sr[j] * scale - m);
        sr[j] = e;
        z += e;
    }
    z = block_sum(z, shared);
    for (int j = threadIdx.x; j < width; j += blockDim.x) sr[j] = sr[j] / z;
}

// Softmax backward of one row per block, all contiguous (rows, width):
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


def softmax_forward(s, scale=1.0):
    """``softmax(scale * s)`` along the last axis, written into ``s`` (C-contiguous rows), returned."""
    cuda.check("softmax_forward", s)
    if not s.flags.c_contiguous:
        raise ValueError("softmax_forward: s must be C-contiguous (it is overwritten in place)")
    d = s.shape[-1]
    n = s.size // d if d else 0
    if n and d:
        cuda.kernel(SOURCE, "softmax_forward", s.dtype)((n,), (cuda.block(d),), (s, np.int32(d), s.dtype.type(scale)))
    return s


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
    x = rng.standard_normal((3, 37)) * 4
    p = np.exp(0.5 * x - (0.5 * x).max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    g = rng.standard_normal((3, 37))
    cp = cuda.cupy()
    forward = softmax_forward(cp.asarray(x, dtype=dtype), 0.5)
    got = softmax_backward(cp.asarray(p, dtype=dtype), cp.asarray(g, dtype=dtype))
    return [("the softmax", forward, p), ("the softmax backward", got, p * (g - (g * p).sum(axis=1, keepdims=True)))]
