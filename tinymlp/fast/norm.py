"""LayerNorm, fast: no input-sized temporaries, sums as products, buffers reused.

The reference (ops/norm.py) is the formula; this is the same arithmetic arranged for memory:

- ``normalize``: the mean, then x_hat = x - mean written once into a new array laid out like x,
  the variance from it (two passes: accurate when the mean is large), x_hat scaled in place;
- sums over a whole axis never allocate an array of the input's size: a row sum is one
  ``einsum`` pass, a column sum a product 1^T X with a ones vector (a GEMV, 2x faster than
  ``x.sum(0)``), a row dot ``vecdot``, a column dot ``einsum``;
- ``layer_norm_backward`` may use G and x_hat as its buffers when the caller no longer needs
  them (``overwrite_g``, ``overwrite_xhat``), and writes dx into ``out`` when given (the SGU
  writes it straight into its half of dL/dz).

Rows are read in the memory order of x_hat (``layout.rows``), so a token-major array is never
copied.

Three implementations, one per back end; each runs ``FastLayerNorm``'s code where its kernels
do not take the arrays:

- ``FastLayerNorm``: the NumPy code above (and the same array code on CuPy);
- ``CompiledLayerNorm`` (CPU, numba installed): one compiled pass over the rows each way
  (``kernels/norm_numba.py``); forward writes y only and saves its *input* with the row means
  and 1/std, and backward recomputes x_hat on the fly;
- ``CudaLayerNorm`` (CUDA): forward and backward each one kernel per row
  (``kernels/norm_cuda.py``).

Each class also offers its ``normalize`` and ``layer_norm_backward`` to the spatial gating unit
(fast/gating.py), whose LayerNorm is the LayerNorm class of its own back end.
"""

from __future__ import annotations

import numpy as np

from ..backend import array_module
from ..ops.norm import LayerNorm, check_inputs
from ..ops.norm import normalize as reference_normalize
from . import compiled, cuda
from .engine import last_backward, take_saved
from .kernels import norm_cuda, norm_numba
from .layout import inverse, memory_order, rows

__all__ = ["CompiledLayerNorm", "CudaLayerNorm", "FastLayerNorm", "backward_rows", "layer_norm_backward", "normalize",
           "row_sum"]


def _row_order(x):
    """The memory order of x when its rows (last axis) are contiguous, else C order."""
    order = memory_order(x)
    return order if order[-1] == x.ndim - 1 else tuple(range(x.ndim))


def row_sum(x):
    xp = array_module(x)
    return xp.einsum("...d->...", x) if xp is np else x.sum(axis=-1)    # CuPy's einsum costs the host more


def row_dot(a, b):
    xp = array_module(a)
    vecdot = getattr(xp, "vecdot", None)
    return vecdot(a, b) if vecdot is not None else xp.einsum("...c,...c->...", a, b)


def column_sum(g, order):
    G = rows(g, order)
    return array_module(g).ones(G.shape[0], dtype=G.dtype) @ G


def column_dot(a, b, order):
    return array_module(a).einsum("nc,nc->c", rows(a, order), rows(b, order))


def normalize(x, eps):
    """``(x_hat, rstd)`` as ops.norm.normalize; x_hat is new, laid out like x."""
    xp = array_module(x)
    d = x.shape[-1]
    mean = row_sum(x)[..., None]
    mean /= d
    xhat = xp.subtract(x, mean, out=xp.empty_like(x))
    with np.errstate(over="ignore"):               # an overflow is caught just below
        var = row_dot(xhat, xhat)[..., None]
    if xp is np and not np.isfinite(var).all():   # a square overflowed (|x - mean| > 1.8e19 in float32)
        xhat[...], rstd = reference_normalize(x, eps)   # the reference scales before it squares
        return xhat, rstd
    var /= d
    var += eps
    rstd = xp.divide(1, xp.sqrt(var, out=var), out=var)
    xhat *= rstd
    return xhat, rstd


def layer_norm_backward(g, xhat, rstd, weight=None, *, out=None, need_dx=True, need_dweight=True,
                        need_dbias=True, overwrite_g=False, overwrite_xhat=False):
    """``(dx, dweight, dbias)`` of y = weight * x_hat + bias from G = dL/dy (None where not asked)."""
    xp = array_module(g)
    order = _row_order(xhat)
    dweight = column_dot(g, xhat, order) if need_dweight else None
    dbias = column_sum(g, order) if need_dbias else None
    if not need_dx:
        return None, dweight, dbias
    d = xhat.shape[-1]
    if weight is not None:
        g = xp.multiply(g, weight, out=g if overwrite_g else xp.empty_like(xhat))   # dL/dx_hat
    elif not overwrite_g:
        g = g.copy()
    mean_g = row_sum(g)[..., None]
    mean_gx = row_dot(g, xhat)[..., None]
    mean_g /= d
    mean_gx /= d
    g -= mean_g
    g -= xp.multiply(xhat, mean_gx, out=xhat if overwrite_xhat else None)
    return xp.multiply(g, rstd, out=g if out is None else out), dweight, dbias


class FastLayerNorm(LayerNorm):
    """``LayerNorm`` with the passes above."""

    normalize = staticmethod(normalize)
    layer_norm_backward = staticmethod(layer_norm_backward)

    @classmethod
    def forward(cls, ctx, x, weight, bias, eps=1e-5):
        check_inputs(x, weight, bias, eps)
        xhat, rstd = cls.normalize(x, eps)
        y = xhat * weight if weight is not None else xhat.copy()
        if bias is not None:
            y += bias
        ctx.save_for_backward(xhat, rstd, weight)
        ctx.has_bias = bias is not None
        return y

    @classmethod
    def backward(cls, ctx, grad):
        xhat, rstd, weight = take_saved(ctx)
        need_x, need_w, need_b = ctx.needs_input_grad
        return cls.layer_norm_backward(grad, xhat, rstd, weight, need_dx=need_x, need_dweight=need_w,
                                       need_dbias=need_b and ctx.has_bias, overwrite_xhat=last_backward(ctx))


def _compiled_normalize(x, eps):
    """``normalize`` in one compiled pass, or the NumPy code where the kernel does not take x."""
    done = norm_numba.normalize(x, eps)
    return done if done is not None else normalize(x, eps)


def _compiled_backward(g, xhat, rstd, weight=None, *, out=None, need_dx=True, need_dweight=True, need_dbias=True,
                       overwrite_g=False, overwrite_xhat=False):
    """``layer_norm_backward`` in one compiled pass, or the NumPy code where the kernel does not apply."""
    done = norm_numba.layer_norm_backward(g, xhat, rstd, weight, out, need_dx, need_dweight, need_dbias)
    if done is not None:
        return done
    return layer_norm_backward(g, xhat, rstd, weight, out=out, need_dx=need_dx, need_dweight=need_dweight,
                               need_dbias=need_dbias, overwrite_g=overwrite_g, overwrite_xhat=overwrite_xhat)


class CompiledLayerNorm(FastLayerNorm):
    """LayerNorm as one compiled pass over the rows each way; saves x, the row means and 1/std."""

    normalize = staticmethod(_compiled_normalize)
    layer_norm_backward = staticmethod(_compiled_backward)

    @classmethod
    def forward(cls, ctx, x, weight, bias, eps=1e-5):
        check_inputs(x, weight, bias, eps)
        arrays = [a for a in (x, weight, bias) if a is not None]
        X, order = norm_numba.row_matrix(x) if compiled.applies(*arrays) and x.size else (None, None)
        done = norm_numba.forward_rows(X, weight, bias, eps) if X is not None else None
        if done is None:                                              # no kernel for x, or it failed
            ctx.compiled = False
            return super().forward(ctx, x, weight, bias, eps)
        Y, mean, rstd = done
        ctx.compiled, ctx.order, ctx.has_bias = True, order, bias is not None
        ctx.save_for_backward(X, mean, rstd, weight)
        return Y.reshape(tuple(x.shape[i] for i in order)).transpose(inverse(order))

    @classmethod
    def backward(cls, ctx, grad):
        if not ctx.compiled:
            return super().backward(ctx, grad)
        X, mean, rstd, weight = take_saved(ctx)
        need_x, need_w, need_b = ctx.needs_input_grad
        order = ctx.order
        G = np.ascontiguousarray(grad.transpose(order)).reshape(X.shape)   # a view when laid out like y
        if G.dtype != X.dtype:
            G = G.astype(X.dtype)
        dX, dw, db = backward_rows(G, X, mean, rstd, weight, need_x)
        dx = dX.reshape(tuple(ctx.input_shapes[0][i] for i in order)).transpose(inverse(order)) if need_x else None
        return dx, (dw if need_w else None), (db if need_b and ctx.has_bias else None)


def backward_rows(G, X, mean, rstd, weight, need_dx, out=None):
    """``norm_numba.backward_rows`` on rows (N, D) of the LayerNorm's input X and its row statistics:
    dX (into ``out`` where given), dw, db; the same by the NumPy code where the kernel failed (what
    the compiled classes save has no x_hat)."""
    done = norm_numba.backward_rows(G, X, mean, rstd, rstd, weight, need_dx, out=out)
    if done is not None:
        return done
    xhat = (X - mean[:, None]) * rstd[:, None]
    dX, dw, db = layer_norm_backward(G, xhat, rstd[:, None], weight, need_dx=need_dx, overwrite_xhat=True)
    if dX is not None and out is not None:
        out[...] = dX
        dX = out
    return dX, dw, db


def _cuda_normalize(x, eps):
    """``normalize`` as one kernel per row, or the array code where the kernels do not take x."""
    if not cuda.applies(x):
        return normalize(x, eps)
    xhat, rstd = norm_cuda.layer_norm_normalize(x, eps)
    return xhat, rstd[..., None]


def _cuda_backward(g, xhat, rstd, weight=None, *, out=None, need_dx=True, need_dweight=True, need_dbias=True,
                   overwrite_g=False, overwrite_xhat=False):
    """``layer_norm_backward`` as kernels over rows, or the array code where they do not apply."""
    if not cuda.applies(g, xhat, rstd, weight):
        return layer_norm_backward(g, xhat, rstd, weight, out=out, need_dx=need_dx, need_dweight=need_dweight,
                                   need_dbias=need_dbias, overwrite_g=overwrite_g, overwrite_xhat=overwrite_xhat)
    return norm_cuda.layer_norm_backward(g, xhat, rstd[..., 0], weight, out=out, need_dx=need_dx,
                                         need_dweight=need_dweight, need_dbias=need_dbias)


class CudaLayerNorm(FastLayerNorm):
    """``LayerNorm`` on CUDA: forward and backward each one kernel per row."""

    normalize = staticmethod(_cuda_normalize)
    layer_norm_backward = staticmethod(_cuda_backward)

    @classmethod
    def forward(cls, ctx, x, weight, bias, eps=1e-5):
        check_inputs(x, weight, bias, eps)
        if not cuda.applies(x, weight, bias):
            return super().forward(ctx, x, weight, bias, eps)
        y, xhat, rstd = norm_cuda.layer_norm_forward(x, weight, bias, eps)
        ctx.save_for_backward(xhat, rstd[..., None], weight)
        ctx.has_bias = bias is not None
        return y
