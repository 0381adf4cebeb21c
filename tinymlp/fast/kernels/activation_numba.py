"""GELU (tanh form) on the CPU, compiled by numba: y and dy/dx in one pass, G * dy/dx in one.

In float32, tanh is a rational function (Eigen's ``generic_fast_tanh_float``, a few ulp) that
vectorises, where libm's scalar ``tanhf`` made the kernel slower than NumPy's SIMD ``tanh``;
float64 keeps libm's tanh. The fast tier's ``CompiledGELU`` (fast/activation.py) calls
``gelu_tanh`` and ``gelu_backward``; the formulas are derived in ops/activation.py.
"""

from __future__ import annotations

import numpy as np

from ...ops.activation import C0, C1
from .. import compiled
from ..compiled import prange
from ..layout import inverse, memory_order

__all__ = ["bias_layout", "gelu_backward", "gelu_tanh", "gelu_tanh_bias"]


def _tanh32(u):
    # tanh in float32 as a rational function (Eigen's generic_fast_tanh_float: a few ulp),
    # plain arithmetic that vectorises; libm's scalar tanhf would be 8x slower than NumPy
    big = np.float32(7.90531110763549805)      # beyond it tanh is +-1 in float32
    v = min(max(u, -big), big)
    u2 = v * v
    p = u2 * np.float32(-2.76076847742355e-16) + np.float32(2.00018790482477e-13)
    p = u2 * p + np.float32(-8.60467152213735e-11)
    p = u2 * p + np.float32(5.12229709037114e-08)
    p = u2 * p + np.float32(1.48572235717979e-05)
    p = u2 * p + np.float32(6.37261928875436e-04)
    p = u2 * p + np.float32(4.89352455891786e-03)
    q = u2 * np.float32(1.19825839466702e-06) + np.float32(1.18534705686654e-04)
    q = u2 * q + np.float32(2.26843463243900e-03)
    q = u2 * q + np.float32(4.89352518554385e-03)
    t = v * p / q
    one = np.float32(1)
    return one if u >= big else (-one if u <= -big else t)


tanh32 = compiled.inline(_tanh32)


def _gelu32_at(xi, c0, c1, c3, half, one):
    # (y, dy/dx) at one point: y = x h, h = (1 + t)/2, t = tanh(c0 x (1 + c1 x^2));
    # dy/dx = h + y (1 - t) c0 (1 + 3 c1 x^2); where t is -1 or 1, the limits (0, 0) and (x, 1)
    # (the products would be NaN at -inf, +inf, or once x^2 overflows)
    x2 = xi * xi
    t = tanh32(c0 * xi * (one + c1 * x2))
    h = half * (one + t)
    yi = xi * h if h != one - one else h
    return yi, (h + yi * (one - t) * (c0 * (one + c3 * x2)) if t * t != one else h)


def _gelu64_at(xi, c0, c1, c3, half, one):
    # the same in float64, with libm's tanh (float64 results as exact as the reference's)
    x2 = xi * xi
    t = np.tanh(c0 * xi * (one + c1 * x2))
    h = half * (one + t)
    yi = xi * h if h != one - one else h
    return yi, (h + yi * (one - t) * (c0 * (one + c3 * x2)) if t * t != one else h)


gelu32_at, gelu64_at = compiled.inline(_gelu32_at), compiled.inline(_gelu64_at)


def _gelu_tanh32(x, y, d, c0, c1, c3, half, one):
    for i in prange(x.shape[0]):
        y[i], d[i] = gelu32_at(x[i], c0, c1, c3, half, one)


def _gelu_tanh64(x, y, d, c0, c1, c3, half, one):
    for i in prange(x.shape[0]):
        y[i], d[i] = gelu64_at(x[i], c0, c1, c3, half, one)


def _gelu_tanh32_value(x, y, c0, c1, half, one):
    for i in prange(x.shape[0]):
        xi = x[i]
        h = half * (one + tanh32(c0 * xi * (one + c1 * xi * xi)))
        y[i] = xi * h if h != one - one else h


def _gelu_tanh64_value(x, y, c0, c1, half, one):
    for i in prange(x.shape[0]):
        xi = x[i]
        h = half * (one + np.tanh(c0 * xi * (one + c1 * xi * xi)))
        y[i] = xi * h if h != one - one else h


# GELU of x + bias on x's memory seen as (rows, cols): the bias b[j] along each row (inner: x's
# last axis is its fastest) or b[r] for all of row r (x's last axis its slowest). Each row is a
# slice: indexed as x[r * cols + j], the parallel kernel's loop did not vectorise.
def _gelu_tanh32_bias(x, b, inner, rows, cols, y, d, c0, c1, c3, half, one):
    for r in prange(rows):
        lo = r * cols
        xr, yr, dr = x[lo:lo + cols], y[lo:lo + cols], d[lo:lo + cols]
        if inner:
            for j in range(cols):
                yr[j], dr[j] = gelu32_at(xr[j] + b[j], c0, c1, c3, half, one)
        else:
            br = b[r]
            for j in range(cols):
                yr[j], dr[j] = gelu32_at(xr[j] + br, c0, c1, c3, half, one)


def _gelu_tanh64_bias(x, b, inner, rows, cols, y, d, c0, c1, c3, half, one):
    for r in prange(rows):
        lo = r * cols
        xr, yr, dr = x[lo:lo + cols], y[lo:lo + cols], d[lo:lo + cols]
        if inner:
            for j in range(cols):
                yr[j], dr[j] = gelu64_at(xr[j] + b[j], c0, c1, c3, half, one)
        else:
            br = b[r]
            for j in range(cols):
                yr[j], dr[j] = gelu64_at(xr[j] + br, c0, c1, c3, half, one)


def _multiply(a, b, out):
    for i in prange(a.shape[0]):
        out[i] = a[i] * b[i]


GELU_TANH32, GELU_TANH32_VALUE = compiled.jit(_gelu_tanh32), compiled.jit(_gelu_tanh32_value)
GELU_TANH64, GELU_TANH64_VALUE = compiled.jit(_gelu_tanh64), compiled.jit(_gelu_tanh64_value)
GELU_TANH32_BIAS, GELU_TANH64_BIAS = compiled.jit(_gelu_tanh32_bias), compiled.jit(_gelu_tanh64_bias)
MULTIPLY = compiled.jit(_multiply)


def flat(x):
    """``(flat view, order)`` of x in its memory order, or (None, None) when x is not contiguous
    in any order of its axes."""
    order = memory_order(x)
    xt = x.transpose(order)
    if not xt.flags.c_contiguous:
        return None, None
    return xt.reshape(-1), order


def gelu_tanh(x, want_derivative):
    """``(y, dy/dx)`` of the tanh GELU of a non-empty float32 or float64 ``x`` in one compiled pass,
    both laid out like x (dy/dx None unless ``want_derivative``); None where the kernel failed."""
    xf, order = flat(x)
    if xf is None:
        x = np.ascontiguousarray(x)
        xf, order = x.reshape(-1), tuple(range(x.ndim))
    t = x.dtype.type
    yt = np.empty(xf.size, dtype=x.dtype)
    single = x.dtype == np.float32
    try:
        if want_derivative:
            d = np.empty(xf.size, dtype=x.dtype)
            kernel = compiled.kernel(GELU_TANH32 if single else GELU_TANH64, xf.size)
            kernel(xf, yt, d, t(C0), t(C1), t(3 * C1), t(0.5), t(1))
        else:
            d = None
            kernel = compiled.kernel(GELU_TANH32_VALUE if single else GELU_TANH64_VALUE, xf.size)
            kernel(xf, yt, t(C0), t(C1), t(0.5), t(1))
    except compiled.KernelFailed:
        return None
    shape_t = tuple(x.shape[i] for i in order)
    back = inverse(order)
    return yt.reshape(shape_t).transpose(back), (d.reshape(shape_t).transpose(back) if d is not None else None)


def bias_layout(x):
    """How a bias along x's last axis lies in x's memory: ``"inner"`` (the last axis is the
    fastest), ``"outer"`` (the slowest), or None (x not contiguous in any order, or neither)."""
    xf, order = flat(x)
    if xf is None or x.ndim == 0:
        return None
    last = x.ndim - 1
    return "inner" if order[-1] == last else ("outer" if order[0] == last else None)


def gelu_tanh_bias(x, bias):
    """``(y, dy/dx)`` of the tanh GELU of x + bias (bias along x's last axis) in one compiled
    pass, laid out like x; x as ``bias_layout`` takes it (else ValueError). None where the kernel
    failed."""
    where = bias_layout(x)
    if where is None:
        raise ValueError("gelu_tanh_bias: x's last axis is neither its fastest nor its slowest in memory")
    xf, order = flat(x)
    n = x.shape[-1]
    rows, cols = (xf.size // n, n) if where == "inner" else (n, xf.size // max(n, 1))
    t = x.dtype.type
    y, d = np.empty(xf.size, dtype=x.dtype), np.empty(xf.size, dtype=x.dtype)
    kernel = compiled.kernel(GELU_TANH32_BIAS if x.dtype == np.float32 else GELU_TANH64_BIAS, xf.size)
    try:
        kernel(xf, np.ascontiguousarray(bias, dtype=x.dtype), where == "inner", rows, cols, y, d,
               t(C0), t(C1), t(3 * C1), t(0.5), t(1))
    except compiled.KernelFailed:
        return None
    shape_t = tuple(x.shape[i] for i in order)
    back = inverse(order)
    return y.reshape(shape_t).transpose(back), d.reshape(shape_t).transpose(back)


def gelu_backward(grad, dydx, overwrite):
    """G * dy/dx in one compiled pass, laid out like dy/dx (written into dydx when ``overwrite``);
    None where the kernel does not take the arrays or failed (then the caller multiplies)."""
    df, order = flat(dydx)
    if not compiled.applies(grad, dydx) or df is None or memory_order(grad) != order or \
            not grad.transpose(order).flags.c_contiguous:
        return None
    gf = grad.transpose(order).reshape(-1)
    out = df if overwrite else np.empty_like(df)
    try:
        compiled.kernel(MULTIPLY, gf.size)(gf, df, out)
    except compiled.KernelFailed:
        return None
    return out.reshape(tuple(dydx.shape[i] for i in order)).transpose(inverse(order))
