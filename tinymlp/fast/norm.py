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
copied. On CUDA, forward and backward each run as one kernel per row (``cuda_kernels``).
"""

from __future__ import annotations

import numpy as np

from ..backend import array_module
from ..ops.norm import LayerNorm, _check
from ..ops.norm import normalize as reference_normalize
from . import cuda_kernels, register
from .layout import memory_order, rows

__all__ = ["FastLayerNorm", "layer_norm_backward", "normalize"]

KERNELS = None
"""Compiled versions of ``normalize`` and ``layer_norm_backward`` (set by ``fast.compiled`` when
numba is installed); each returns None where it does not apply, and the code below runs."""


def _row_order(x):
    """The memory order of x when its rows (last axis) are contiguous, else C order."""
    order = memory_order(x)
    return order if order[-1] == x.ndim - 1 else tuple(range(x.ndim))


def row_sum(x):
    return array_module(x).einsum("...d->...", x)


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
    if cuda_kernels.applies(x):
        xhat, rstd = cuda_kernels.layer_norm_normalize(x, eps)
        return xhat, rstd[..., None]
    if KERNELS is not None:
        done = KERNELS.normalize(x, eps)
        if done is not None:
            return done
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
    if cuda_kernels.applies(g, xhat, rstd, weight):
        return cuda_kernels.layer_norm_backward(g, xhat, rstd[..., 0], weight, out=out, need_dx=need_dx,
                                                need_dweight=need_dweight, need_dbias=need_dbias)
    if KERNELS is not None:
        done = KERNELS.backward(g, xhat, rstd, weight, out, need_dx, need_dweight, need_dbias)
        if done is not None:
            return done
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


@register(LayerNorm)
class FastLayerNorm(LayerNorm):
    """``LayerNorm`` with the passes above (one kernel per row on CUDA)."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps=1e-5):
        _check(x, weight, bias, eps)
        if cuda_kernels.applies(x, weight, bias):
            y, xhat, rstd = cuda_kernels.layer_norm_forward(x, weight, bias, eps)
            rstd = rstd[..., None]
        else:
            xhat, rstd = normalize(x, eps)
            y = xhat * weight if weight is not None else xhat.copy()
            if bias is not None:
                y += bias
        ctx.save_for_backward(xhat, rstd, weight)
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx, grad):
        xhat, rstd, weight = ctx.pop_saved()
        need_x, need_w, need_b = ctx.needs_input_grad
        return layer_norm_backward(grad, xhat, rstd, weight, need_dx=need_x, need_dweight=need_w,
                                   need_dbias=need_b and ctx.has_bias, overwrite_xhat=not ctx.retain_graph)
