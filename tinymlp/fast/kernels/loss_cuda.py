"""Softmax cross-entropy with class ids on CUDA: one thread block per example (row).

    cross_entropy_forward(x, y, alpha) -> (p, loss rows)   the row's maximum, exponentials, their
                                                           sum, the softmax p (kept for backward)
                                                           and the row's share of the mean loss
    cross_entropy_backward(p, y, g, alpha) -> dx           dx = (p - alpha/K - (1 - alpha) [j = y])
                                                                * g / B

The formulas are derived in ``tinymlp/ops/loss.py`` (hard targets, label smoothing alpha): with
s = x - max x and lse = log sum exp s, a row's term is (1 - alpha) (s_y - lse) + (alpha / K)
(sum_k s_k - K lse), and the loss is minus their mean. The mean of the rows is one more
reduction; g (a 0-d device array) is read by the backward kernel itself: nothing goes to the host.
"""

from __future__ import annotations

import numpy as np

from .. import cuda

__all__ = ["SOURCE", "cross_entropy_backward", "cross_entropy_forward"]

SOURCE = r"""// Forward of one row per block; x, p contiguous (rows, width), y the class ids (int64).
// loss_rows[b] = -((1 - alpha) (s_y - lse) + (alpha / K) (sum_k s_k - K lse)) / B; a class id
// outside 0..K-1 makes the row NaN (the loaders refuse such ids on the host before this).
extern "C" __global__ void cross_entropy_forward(
        const T* x, const long long* y, T* p, T* loss_rows, const int width, const T alpha,
        const T inv_batch) {
    __shared__ T shared[33];
    const long long row = blockIdx.x;
    const T* xr = x + row * width;
    T* pr = p + row * width;
    T m = lowest_t(T(0));
    for (int j = threadIdx.x; j < width; j += blockDim.x) m = xr[j] > m ? xr[j] : m;
    m = block_max(m, shared, lowest_t(T(0)));
    T z = 0, total = 0;
    for (int j = threadIdx.x; j < width; j += blockDim.x) {
        const T s = xr[j] - m;
        const T e = exp_t(s);
        pr[j] = e;
        z += e;
        total += s;
    }
    z = block_sum(z, shared);
    total = block_sum(total, shared);
    for (int j = threadIdx.x; j < width; j += blockDim.x) pr[j] = pr[j] / z;
    if (threadIdx.x == 0) {
        const long long c = y[row];
        const T lse = log_t(z);
        const T picked = (c >= 0 && c < width) ? xr[c] - m : T(0) / T(0);
        T term = (T(1) - alpha) * (picked - lse);
        if (alpha != T(0)) term = term + (alpha / T(width)) * (total - T(width) * lse);
        loss_rows[row] = -term * inv_batch;
    }
}

// Backward of one row per block: dx = (p - alpha / K - (1 - alpha) [j = y]) * g / B.
extern "C" __global__ void cross_entropy_backward(
        const T* p, const long long* y, const T* g, T* dx, const int width, const T alpha,
        const T inv_batch) {
    const long long row = blockIdx.x;
    const T scale = g[0] * inv_batch;
    const long long c = y[row];
    const T* pr = p + row * width;
    T* dr = dx + row * width;
    for (int j = threadIdx.x; j < width; j += blockDim.x) {
        T d = pr[j] - alpha / T(width);
        if (j == c) d = d - (T(1) - alpha);
        dr[j] = d * scale;
    }
}
"""


def cross_entropy_forward(x, y, alpha):
    """``(p, loss_rows)`` for logits x (B, K) C-contiguous and class ids y (B,) int64: the softmax,
    and each row's share of the mean loss (their sum is the loss)."""
    cp = cuda.cupy()
    cuda.check("cross_entropy_forward", x)
    B, K = x.shape
    _check_ids("cross_entropy_forward", y, B)
    p = cp.empty((B, K), dtype=x.dtype)
    rows = cp.empty(B, dtype=x.dtype)
    if B and K:
        t = x.dtype.type
        cuda.kernel(SOURCE, "cross_entropy_forward", x.dtype)(
            (B,), (cuda.block(K),), (x, y, p, rows, np.int32(K), t(alpha), t(1.0 / B)))
    return p, rows


def cross_entropy_backward(p, y, g, alpha):
    """dL/dx from the saved softmax p (B, K), the class ids y and the upstream gradient g (0-d)."""
    cp = cuda.cupy()
    cuda.check("cross_entropy_backward", p, g)
    B, K = p.shape
    _check_ids("cross_entropy_backward", y, B)
    if g.size != 1:
        raise ValueError(f"cross_entropy_backward: the upstream gradient must hold one value, got shape {g.shape}")
    dx = cp.empty((B, K), dtype=p.dtype)
    if B and K:
        t = p.dtype.type
        cuda.kernel(SOURCE, "cross_entropy_backward", p.dtype)(
            (B,), (cuda.block(K),), (p, y, g, dx, np.int32(K), t(alpha), t(1.0 / B)))
    return dx


def _check_ids(name, y, batch):
    """The kernels read ``batch`` class ids at unit stride from y's first element (the Launcher
    checks the device, the dtype and the layout; the length is checked here)."""
    if getattr(y, "shape", None) != (batch,):
        raise ValueError(f"{name}: expected {batch} class ids, one per row of the logits, got an array of shape "
                         f"{getattr(y, 'shape', None)}")


@cuda.self_test
def _self_test(dtype):
    cp = cuda.cupy()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 37)) * 3
    y = np.array([0, 36, 5, 5, 17])
    alpha = 0.1
    s = x - x.max(axis=1, keepdims=True)
    lse = np.log(np.exp(s).sum(axis=1))
    p = np.exp(s - lse[:, None])
    rows = -((1 - alpha) * (s[np.arange(5), y] - lse) + (alpha / 37) * (s.sum(axis=1) - 37 * lse)) / 5
    dx = p - alpha / 37
    dx[np.arange(5), y] -= 1 - alpha
    p_dev, rows_dev = cross_entropy_forward(cp.asarray(x, dtype=dtype), cp.asarray(y), alpha)
    dx_dev = cross_entropy_backward(p_dev, cp.asarray(y), cp.asarray(2.0, dtype=dtype), alpha)
    return [("the cross-entropy's softmax", p_dev, p), ("the cross-entropy's rows", rows_dev, rows),
            ("the cross-entropy's backward", dx_dev, dx * 2.0 / 5)]
