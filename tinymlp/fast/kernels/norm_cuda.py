"""LayerNorm on CUDA: the row kernels and their launchers (the fast tier's ``CudaLayerNorm`` and
the SGU's LayerNorm call them).

    layer_norm_forward(x, w, b, eps) -> (y, xhat, rstd)     one thread block per row: mean,
    layer_norm_normalize(x, eps) -> (xhat, rstd)            variance and the output in one launch
    layer_norm_backward(g, xhat, rstd, w) -> (dx, dw, db)   one block per row for dx, and two
    layer_norm_param_grads(g, xhat) -> (dw, db)             launches for dw, db (chunks of rows,
                                                            then the chunks' sum)

The formulas and their derivation are in ``tinymlp/ops/norm.py``; ``tests/test_cuda.py`` checks
each launcher against them on a GPU (float32 and float64, odd widths, one row, strided views).
Rows are the last axis; x may be a view with evenly spaced rows (``z[..., e:]``) or laid out
token-major, and is read in place.
"""

from __future__ import annotations

import numpy as np

from .. import cuda
from ..layout import inverse

__all__ = ["SOURCE", "layer_norm_backward", "layer_norm_forward", "layer_norm_normalize", "layer_norm_param_grads"]

SOURCE = r"""// LayerNorm forward of one row per block. x rows start every x_stride elements (a strided
// view such as z[..., e:] is read in place); xhat, y are contiguous (rows, width).
// xhat = (x - mean) * rstd, rstd = 1 / sqrt(var + eps); y = xhat * weight + bias if affine.
// A row whose squares overflow (|x - mean| past sqrt of the largest float: 1.8e19 in float32)
// is normalised as ops/norm.py does it: divided by its largest |x - mean| s before squaring,
// std = s sqrt(mean((c / s)^2)) and rstd = 1 / hypot(std, sqrt(eps)). The branch is taken by
// the whole block or not at all (every thread sees the same sum).
extern "C" __global__ void layer_norm_forward(
        const T* x, const long long x_stride, const T* weight, const T* bias,
        T* y, T* xhat, T* rstd, const int width, const T eps, const int affine) {
    __shared__ T shared[33];
    const long long row = blockIdx.x;
    const T* xr = x + row * x_stride;
    T s = 0;
    for (int j = threadIdx.x; j < width; j += blockDim.x) s += xr[j];
    const T mean = block_sum(s, shared) / T(width);
    T ss = 0;
    for (int j = threadIdx.x; j < width; j += blockDim.x) {
        const T c = xr[j] - mean;
        ss += c * c;
    }
    const T var = block_sum(ss, shared) / T(width);
    T r;
    if (var - var == T(0)) {                      // finite: the usual case
        r = T(1) / sqrt_t(var + eps);
    } else {
        T m = 0;
        for (int j = threadIdx.x; j < width; j += blockDim.x) {
            const T c = abs_t(xr[j] - mean);
            m = c > m ? c : m;
        }
        const T scale = block_max(m, shared, T(0));
        T q = 0;
        for (int j = threadIdx.x; j < width; j += blockDim.x) {
            const T c = (xr[j] - mean) / scale;
            q += c * c;
        }
        r = T(1) / hypot_t(scale * sqrt_t(block_sum(q, shared) / T(width)), sqrt_t(eps));
    }
    T* hr = xhat + row * width;
    T* yr = y + row * width;
    for (int j = threadIdx.x; j < width; j += blockDim.x) {
        const T h = (xr[j] - mean) * r;
        hr[j] = h;
        if (affine) yr[j] = h * weight[j] + bias[j];
    }
    if (threadIdx.x == 0) rstd[row] = r;
}

// LayerNorm backward (dx only) of one row per block; g, xhat contiguous (rows, width), dx rows
// every dx_stride elements. With gw = g * weight:
//   dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)).
// Each thread reads g[j], xhat[j] before writing dx[j] of the same j, so dx may alias g.
extern "C" __global__ void layer_norm_backward(
        const T* g, const T* xhat, const T* rstd, const T* weight,
        T* dx, const long long dx_stride, const int width) {
    __shared__ T shared[33];
    const long long row = blockIdx.x;
    const T* gr = g + row * width;
    const T* hr = xhat + row * width;
    T a = 0, b = 0;
    for (int j = threadIdx.x; j < width; j += blockDim.x) {
        const T gw = gr[j] * weight[j];
        a += gw;
        b += gw * hr[j];
    }
    const T mean_g = block_sum(a, shared) / T(width);
    const T mean_gx = block_sum(b, shared) / T(width);
    const T r = rstd[row];
    T* dr = dx + row * dx_stride;
    for (int j = threadIdx.x; j < width; j += blockDim.x) {
        dr[j] = r * (gr[j] * weight[j] - mean_g - hr[j] * mean_gx);
    }
}

// LayerNorm's parameter gradients, first pass: column sums of g * xhat (dweight) and of g
// (dbias) over one chunk of rows. g, xhat contiguous (rows, width). A block of 32 x 8 threads
// covers 32 columns (blockIdx.x) of the chunk blockIdx.y: the 32 threads of a warp read 32
// neighbouring columns of a row (coalesced), the 8 warps take every 8th row, and shared
// memory adds the 8 partial sums. partial is (2, chunks, width): [0] dweight's, [1] dbias's.
extern "C" __global__ void layer_norm_param_partials(
        const T* g, const T* xhat, T* partial, const long long rows, const int width,
        const long long rows_per_chunk) {
    __shared__ T sa[8][33];
    __shared__ T sb[8][33];
    const int col = blockIdx.x * 32 + threadIdx.x;
    const long long chunk = blockIdx.y;
    const long long start = chunk * rows_per_chunk;
    const long long end = start + rows_per_chunk < rows ? start + rows_per_chunk : rows;
    T a = 0, b = 0;
    if (col < width) {
        for (long long r = start + threadIdx.y; r < end; r += blockDim.y) {
            const T gv = g[r * width + col];
            a += gv * xhat[r * width + col];
            b += gv;
        }
    }
    sa[threadIdx.y][threadIdx.x] = a;
    sb[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y == 0 && col < width) {
        for (int k = 1; k < blockDim.y; ++k) {
            a += sa[k][threadIdx.x];
            b += sb[k][threadIdx.x];
        }
        partial[chunk * width + col] = a;
        partial[(gridDim.y + chunk) * width + col] = b;
    }
}

// Second pass: dweight[c] = sum over k of partial[0, k, c], dbias[c] of partial[1, k, c] (one
// thread each (plane, c), reading the chunks in order: the same sum on every run). Two arrays
// of their own, so that each parameter's gradient is a whole array, not a view of a shared one.
extern "C" __global__ void sum_chunks(
        const T* partial, T* dweight, T* dbias, const int chunks, const int width) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= 2 * width) return;
    const int plane = i / width, col = i % width;
    const T* src = partial + (long long)plane * chunks * width + col;
    T s = 0;
    for (int k = 0; k < chunks; ++k) s += src[(long long)k * width];
    (plane == 0 ? dweight : dbias)[col] = s;
}

"""


def layer_norm_forward(x, weight, bias, eps):
    """LayerNorm over the last axis of ``x`` (..., D): ``(y, xhat, rstd)``.

    y = xhat * weight + bias with xhat = (x - mean) * rstd, rstd = 1/sqrt(var + eps), as in
    ops/norm.py. ``weight`` / ``bias`` (D,) may be None (1 and 0). y and xhat have x's shape,
    rstd has shape x.shape[:-1]. x may be a view with evenly spaced rows (e.g. ``z[..., e:]``),
    read in place into C-order outputs, or contiguous in another order of its leading axes
    (token-major (B, S, C)), read in place into outputs laid out like x.
    """
    return _layer_norm_forward(x, weight, bias, eps, affine=True)


def layer_norm_normalize(x, eps):
    """The LayerNorm statistics alone: ``(xhat, rstd)`` (what the SGU saves; it never needs y)."""
    _, xhat, rstd = _layer_norm_forward(x, None, None, eps, affine=False)
    return xhat, rstd


def _layer_norm_forward(x, weight, bias, eps, affine):
    cp = cuda.cupy()
    order = cuda.dense_order(x)
    if order is not None:                         # rows in another order (token-major): read in place
        inv = inverse(order)
        y, xhat, rstd = _layer_norm_forward(x.transpose(order), weight, bias, eps, affine)
        return (None if y is None else y.transpose(inv)), xhat.transpose(inv), rstd.transpose(inv[:-1])
    cuda.check("layer_norm_forward", x, weight, bias)
    d = x.shape[-1]
    layout = cuda.rows(x)
    if layout is None:
        x = cuda.contiguous_rows(x)
        layout = cuda.rows(x)
    n, stride = layout
    xhat = cp.empty(x.shape, dtype=x.dtype)
    rstd = cp.empty(x.shape[:-1], dtype=x.dtype)
    y = cp.empty(x.shape, dtype=x.dtype) if affine else xhat  # not written when affine is off
    if affine:
        weight = cp.ones(d, dtype=x.dtype) if weight is None else cuda.contiguous_rows(weight)
        bias = cp.zeros(d, dtype=x.dtype) if bias is None else cuda.contiguous_rows(bias)
    else:
        weight = bias = xhat  # never read
    if n and d:
        cuda.kernel(SOURCE, "layer_norm_forward", x.dtype)(
            (n,), (cuda.block(d),),
            (x, np.int64(stride), weight, bias, y, xhat, rstd, np.int32(d), x.dtype.type(eps),
             np.int32(1 if affine else 0)),
        )
    return (y if affine else None), xhat, rstd


CHUNK_BLOCKS = 1024
"""About this many thread blocks share the first pass of ``layer_norm_param_grads`` (several per
SM on any current GPU), each over a chunk of at least 32 rows."""


def layer_norm_param_grads(g, xhat):
    """``(dweight, dbias)`` = column sums of ``g * xhat`` and of ``g``, both (rows, D) C-contiguous.

    Two launches whatever the size: partial sums over chunks of rows, then the sum of the chunks
    (see the kernels). A column reduction over axis 0 through CuPy's ``sum`` or a
    ReductionKernel gives each column to one thread block, leaving most of the GPU idle for
    D = 256 columns of 8192+ rows; here every SM has blocks.
    """
    cp = cuda.cupy()
    rows, d = g.shape
    if rows == 0 or d == 0:
        return cp.zeros(d, dtype=g.dtype), cp.zeros(d, dtype=g.dtype)
    dweight, dbias = cp.empty(d, dtype=g.dtype), cp.empty(d, dtype=g.dtype)
    col_blocks = -(-d // 32)
    rows_per_chunk = max(32, -(-rows * col_blocks // CHUNK_BLOCKS))
    chunks = -(-rows // rows_per_chunk)
    partial = cp.empty((2, chunks, d), dtype=g.dtype)
    cuda.kernel(SOURCE, "layer_norm_param_partials", g.dtype)(
        (col_blocks, chunks), (32, 8),
        (g, xhat, partial, np.int64(rows), np.int32(d), np.int64(rows_per_chunk)))
    cuda.kernel(SOURCE, "sum_chunks", g.dtype)(
        (-(-2 * d // 256),), (256,), (partial, dweight, dbias, np.int32(chunks), np.int32(d)))
    return dweight, dbias


def layer_norm_backward(g, xhat, rstd, weight, out=None, need_dx=True, need_dweight=True, need_dbias=True):
    """LayerNorm backward: ``(dx, dweight, dbias)`` from g = dL/dy, the saved xhat and rstd.

    dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)) with gw = g * weight (weight None
    means 1), dweight = sum over rows of g * xhat, dbias = sum over rows of g (see ops/norm.py).
    ``out``: where to write dx (any array of x's shape with evenly spaced rows, e.g. a slice
    ``dz[..., e:]`` of a larger gradient); a new array otherwise, laid out like xhat (a
    token-major xhat is read, and dx written, in its memory order). A gradient that is not asked
    for (``need_*`` False) is returned as None and not computed.
    """
    cp = cuda.cupy()
    cuda.check("layer_norm_backward", g, xhat, rstd, weight)
    order = cuda.dense_order(xhat)
    if order is not None:                         # xhat token-major: work in its memory order
        inv = inverse(order)
        dx, dweight, dbias = layer_norm_backward(
            g.transpose(order), xhat.transpose(order), rstd.transpose(order[:-1]), weight,
            out=None if out is None else out.transpose(order), need_dx=need_dx,
            need_dweight=need_dweight, need_dbias=need_dbias)
        if dx is not None:
            dx = out if out is not None else dx.transpose(inv)
        return dx, dweight, dbias
    d = xhat.shape[-1]
    g, xhat = cuda.contiguous_rows(g), cuda.contiguous_rows(xhat)
    dweight = dbias = None
    if need_dweight or need_dbias:
        dweight, dbias = layer_norm_param_grads(g.reshape(-1, d), xhat.reshape(-1, d))
        dweight, dbias = (dweight if need_dweight else None), (dbias if need_dbias else None)
    dx = None
    if need_dx:
        dx = cp.empty(xhat.shape, dtype=xhat.dtype) if out is None else out
        layout = cuda.rows(dx)
        target = dx if layout is not None else cp.empty(xhat.shape, dtype=xhat.dtype)
        n, stride = cuda.rows(target)
        w = cp.ones(d, dtype=xhat.dtype) if weight is None else cuda.contiguous_rows(weight)
        if n and d:
            cuda.kernel(SOURCE, "layer_norm_backward", xhat.dtype)(
                (n,), (cuda.block(d),),
                (g, xhat, cuda.contiguous_rows(rstd), w, target, np.int64(stride), np.int32(d)),
            )
        if target is not dx:  # an out= whose rows are not evenly spaced: copy in
            dx[...] = target
    return dx, dweight, dbias


@cuda.self_test
def _self_test(dtype):
    """Every launcher on rows of 37 (one of them with squares that overflow float32), against
    the reference formulas of ops/norm.py computed in float64."""
    from ...ops.norm import normalize, normalize_backward

    cp = cuda.cupy()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 37)) * 3 + 1
    x[3] *= 1e20                                   # (x - mean)^2 overflows float32 there
    w, b, g = rng.standard_normal(37), rng.standard_normal(37), rng.standard_normal((4, 37))
    dev = lambda v: cp.asarray(v, dtype=dtype)   # noqa: E731
    xhat_ref, rstd_ref = normalize(x, 1e-5)
    y, xhat, rstd = layer_norm_forward(dev(x), dev(w), dev(b), 1e-5)
    xhat_only, _ = layer_norm_normalize(dev(x), 1e-5)
    dx, dw, db = layer_norm_backward(dev(g), xhat, rstd, dev(w))
    return [("LayerNorm", y, xhat_ref * w + b), ("LayerNorm's normalisation", xhat_only, xhat_ref),
            ("LayerNorm's 1/std", rstd * dev(1 / rstd_ref[:, 0]), np.ones(4)),
            ("LayerNorm's backward", dx, normalize_backward(g * w, xhat_ref, rstd_ref)),
            ("LayerNorm's weight gradient", dw, (g * xhat_ref).sum(axis=0)),
            ("LayerNorm's bias gradient", db, g.sum(axis=0))]
