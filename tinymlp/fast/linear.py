"""Linear, fast: one matrix product whatever the memory layout of x, no copies, early frees.

The reference (ops/linear.py) flattens x to X (N, D_in) with ``reshape``, which copies a
transposed view. MLP-Mixer's token mixing is exactly such a view: ``h.swapaxes(1, 2)`` of
activations laid out token-major in memory, (B, C, S) whose slowest axis is S. Read in memory
order, that x is the (S, B*C) matrix X^T (``layout.as_matrix``, kind "columns"), and

    Y^T = W^T X^T              (D_out, B*C): one product for the whole batch, no transpose,

written back in the same order, so the next op (GELU, the second Linear) finds it laid out the
same way. The gradients are the reference's rules read in that order:

    rows    (X (N, D_in), G (N, D_out)):      dW = X^T G,     dX = G W^T,     db = 1^T G
    columns (X^T (D_in, N), G^T (D_out, N)):  dW = X^T (G^T)^T, dX^T = W G^T,   db = G^T 1

Column and row sums are products with a ones vector (a GEMV: faster than ``sum`` on NumPy).
On the last backward, X is released before dX is allocated, which lowers the step's peak.

Where the compiled kernels take the arrays, the bias is left pending (``ctx.pending_bias``):
the GELU after the product adds it in its own pass, and any other reader of the output gets
it added first (``Tensor._data``).

Every product goes through ``product`` (NumPy's ``matmul``); ``CudaLinear`` replaces it with
``cublas.product``, the products a CUDA graph can capture (``fast/cublas.py``).
"""

from __future__ import annotations

import functools

import numpy as np

from ..backend import array_module, device_constant
from ..ops.linear import Linear, check_shapes
from . import compiled, cublas
from .engine import take_saved, takes_pending_bias
from .layout import as_matrix, inverse, same_layout

__all__ = ["CudaLinear", "FastLinear"]


class FastLinear(Linear):
    """``Linear`` on x in its own memory order (see the module docstring)."""

    product = staticmethod(np.matmul)

    @classmethod
    def forward(cls, ctx, x, weight, bias=None):
        check_shapes(x, weight, bias)
        X, order, kind = as_matrix(x)
        d_out = weight.shape[1]
        lead = tuple(x.shape[i] for i in order if i != x.ndim - 1)     # the other axes, in memory order
        defer = bias is not None and compiled.applies(X, bias) and takes_pending_bias(ctx)
        if defer:                       # added by the next op in its own pass, or on first read
            ctx.pending_bias = bias.copy()      # as it is now (an optimizer step may come first)
        if kind == "rows":
            Y = cls.product(X, weight)                       # (N, D_out)
            if bias is not None and not defer:
                Y += bias
            y = Y.reshape(lead + (d_out,))
        else:
            Y = cls.product(weight.T, X)                     # (D_out, N)
            if bias is not None and not defer:
                Y += bias[:, None]
            y = Y.reshape((d_out,) + lead)
        ctx.save_for_backward(X, weight)
        ctx.order, ctx.kind, ctx.has_bias = order, kind, bias is not None
        return y.transpose(inverse(order))                   # y laid out in x's memory order

    @classmethod
    def backward(cls, ctx, grad):
        X, weight = take_saved(ctx)
        need_x, need_w, need_b = ctx.needs_input_grad
        xp = array_module(grad)
        d_out = weight.shape[1]
        Gt = same_layout(grad, ctx.order)       # G in the output's memory order
        if ctx.kind == "rows":
            G = Gt.reshape(-1, d_out)                                 # (N, D_out)
            dw = cls.product(X.T, G) if need_w else None
            del X
            dX = cls.product(G, weight.T) if need_x else None
            db = cls.product(_ones(xp, G.shape[0], G.dtype), G) if (need_b and ctx.has_bias) else None
        else:
            G = Gt.reshape(d_out, -1)                                 # (D_out, N)
            dw = cls.product(X, G.T) if need_w else None
            del X
            dX = cls.product(weight, G) if need_x else None
            db = cls.product(G, _ones(xp, G.shape[1], G.dtype)) if (need_b and ctx.has_bias) else None
        dx = None
        if dX is not None:
            shape_t = tuple(ctx.input_shapes[0][i] for i in ctx.order)
            dx = dX.reshape(shape_t).transpose(inverse(ctx.order))
        return dx, dw, db


class CudaLinear(FastLinear):
    """``FastLinear`` on CUDA: its products through cuBLAS calls a CUDA graph can capture."""

    product = staticmethod(cublas.product)


def _ones(xp, n, dtype):
    """A ones vector of length n, made once per (device, n, dtype) and reused (read only)."""
    return _host_ones(n, dtype) if xp is np else device_constant(xp, ("ones", n, dtype), lambda: _host_ones(n, dtype))


@functools.lru_cache(maxsize=64)
def _host_ones(n, dtype):
    ones = np.ones(n, dtype=dtype)
    ones.flags.writeable = False
    return ones
