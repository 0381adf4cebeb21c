"""Layer normalisation over the last axis: the math on plain arrays (``normalize``,
``layer_norm_backward``, also used by the spatial gating unit in gating.py) and the
``LayerNorm`` Function built on it.

Sums over a whole axis are written once, below, each in the form that measured fastest on
the (batch, tokens, channels) arrays of a training step, and none allocates an array of the
input's size: a row sum is one ``einsum`` pass, a column sum a product 1^T X with a ones vector
(a GEMV, 2x faster than ``einsum`` or ``x.sum(0)``), a row dot ``vecdot``, a column dot ``einsum``.
(A GEMV over rows, ``x @ 1``, is faster alone, but on two BLAS threads it slowed the in-place
updates that follow it in ``layer_norm_backward`` by more than it saved.)
"""

from __future__ import annotations

from ..autograd import Function
from ..backend import array_module
from . import cuda_kernels

__all__ = ["LayerNorm", "layer_norm", "layer_norm_backward", "normalize"]


# --------------------------------------------------------------------------- sums over an axis
def row_sum(x):
    """sum over the last axis, shape x.shape[:-1]."""
    return array_module(x).einsum("...d->...", x)


def column_sum(x):
    """sum over every axis but the last, shape (x.shape[-1],): 1^T X with X = x as rows."""
    rows = x.reshape(-1, x.shape[-1])
    return array_module(x).ones(rows.shape[0], dtype=x.dtype) @ rows


def row_dot(a, b):
    """sum_c a[..., c] * b[..., c], shape a.shape[:-1] (``vecdot`` where the array module has it)."""
    xp = array_module(a)
    vecdot = getattr(xp, "vecdot", None)
    return vecdot(a, b) if vecdot is not None else xp.einsum("...c,...c->...", a, b)


def column_dot(a, b):
    """sum over the rows of a * b, shape (a.shape[-1],)."""
    d = a.shape[-1]
    return array_module(a).einsum("nc,nc->c", a.reshape(-1, d), b.reshape(-1, d))


# --------------------------------------------------------------------------- the math on arrays
def normalize(x, eps):
    r"""x_hat = (x - mu) r over the last axis (width D) of x: returns ``(x_hat, r)``.

    Per row:  mu = (1/D) sum_j x_j,  var = (1/D) sum_j (x_j - mu)^2,  r = 1/sqrt(var + eps).

    The variance is that of x - mu (two passes: accurate when the mean is large). A constant
    row has var = 0: r = 1/sqrt(eps) stays finite and x_hat = 0. x_hat is a new C-contiguous
    array of x's shape whatever x's layout (a strided view, such as half the channels of a
    larger array, is read in place); r has shape x.shape[:-1] + (1,), so it broadcasts
    against the rows. On CUDA: one kernel per row (``cuda_kernels.layer_norm_normalize``).
    """
    if cuda_kernels.applies(x):
        xhat, rstd = cuda_kernels.layer_norm_normalize(x, eps)
        return xhat, rstd[..., None]
    xp = array_module(x)
    d = x.shape[-1]
    mean = row_sum(x)[..., None]
    mean /= d
    xhat = xp.subtract(x, mean, out=xp.empty(x.shape, dtype=x.dtype))
    var = row_dot(xhat, xhat)[..., None]
    var /= d
    var += eps
    rstd = xp.divide(1, xp.sqrt(var, out=var), out=var)
    xhat *= rstd
    return xhat, rstd


def layer_norm_backward(g, xhat, rstd, weight=None, *, out=None, need_dx=True, need_dweight=True,
                        need_dbias=True, overwrite_g=False, overwrite_xhat=False):
    r"""Gradients of y = weight * x_hat + bias (x_hat, r from ``normalize``), from G = dL/dy.

      dL/dbias = sum over rows of G,   dL/dweight = sum over rows of G * x_hat.

    For one row, let g = G * weight = dL/dx_hat. Differentiate x_hat_i = (x_i - mu) r:
        dx_hat_i/dx_j = r (delta_ij - 1/D) + (x_i - mu) dr/dx_j,
        dr/dx_j = -r^3/2 dvar/dx_j = -r^3 (x_j - mu)/D = -(r^2/D) x_hat_j,
    since dvar/dx_j = 2 (x_j - mu)/D (the terms through mu sum to zero). So
        dx_hat_i/dx_j = r (delta_ij - 1/D - x_hat_i x_hat_j / D), and

        dL/dx_j = sum_i g_i dx_hat_i/dx_j = r ( g_j - mean(g) - x_hat_j mean(g * x_hat) ).

    Only x_hat and r are needed (not x, mu and var). Returns ``(dx, dweight, dbias)``, None for
    a gradient not asked for (``need_*``); ``weight`` None means 1. G may be a broadcast view
    (after a mean). dx is written into ``out`` when given (a view of a larger gradient, for
    instance), else it is a new array or G's memory. ``overwrite_g`` / ``overwrite_xhat``: G /
    x_hat are not needed afterwards and may serve as buffers (one array of their size each).
    On CUDA: one kernel per row, plus two column sums (``cuda_kernels.layer_norm_backward``).
    """
    if cuda_kernels.applies(g, xhat, rstd, weight):
        return cuda_kernels.layer_norm_backward(g, xhat, rstd[..., 0], weight, out=out, need_dx=need_dx,
                                                need_dweight=need_dweight, need_dbias=need_dbias)
    xp = array_module(g)
    dweight = column_dot(g, xhat) if need_dweight else None
    dbias = column_sum(g) if need_dbias else None
    if not need_dx:
        return None, dweight, dbias
    d = xhat.shape[-1]
    if weight is not None:
        g = xp.multiply(g, weight, out=g if overwrite_g else None)  # dL/dx_hat
    elif not overwrite_g:
        g = g.copy()
    mean_g = row_sum(g)[..., None]
    mean_gx = row_dot(g, xhat)[..., None]
    mean_g /= d
    mean_gx /= d
    g -= mean_g
    g -= xp.multiply(xhat, mean_gx, out=xhat if overwrite_xhat else None)
    return xp.multiply(g, rstd, out=g if out is None else out), dweight, dbias


# --------------------------------------------------------------------------- the Function
class LayerNorm(Function):
    r"""y = gamma * x_hat + beta over the last axis (width D) of x; gamma, beta of shape (D,).

    x_hat and r = 1/sqrt(var + eps) come from ``normalize`` and are all that backward needs
    (``layer_norm_backward``, with the derivation). ``weight`` or ``bias`` may be None.
    On CUDA, forward (y included) and backward each run as one kernel per row
    (``cuda_kernels``, tested against this code).
    """

    @staticmethod
    def forward(ctx, x, weight, bias, eps=1e-5):
        _check_shapes(x, weight, bias)
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


def _check_shapes(x, weight, bias):
    if x.ndim == 0:
        raise ValueError("layer_norm: the input must have at least one axis (it normalises the last one)")
    d = x.shape[-1]
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != (d,):
            raise ValueError(
                f"layer_norm: {name} of shape {tuple(p.shape)} does not match the last axis of the input "
                f"of shape {tuple(x.shape)}; expected ({d},)"
            )
        if p is not None and p.dtype != x.dtype:
            raise TypeError(f"layer_norm: {name} is {p.dtype} but the input is {x.dtype}; convert with .astype()")


def layer_norm(x, weight, bias, eps=1e-5):
    """Normalise ``x`` over its last axis to zero mean and unit variance, then scale by
    ``weight`` and shift by ``bias`` (each of shape (D,), or None)."""
    return LayerNorm.apply(x, weight, bias, eps=eps)
