"""GELU, fast: in-cache chunks, every step in place, the derivative computed in forward.

Elementwise ops cost memory traffic, not arithmetic: the reference formula makes about 15
passes over its input, each allocating a temporary. Here every step writes into an array it
already owns (``out=``), the cube is ``x*x*x`` (NumPy's ``x**3`` is ~150x slower), and on the
CPU the input is processed in chunks of 64K elements so that the temporaries stay in cache.
Forward already holds t (or Phi), so it computes dy/dx on the spot and saves it: backward is one
multiply, into the saved derivative on the last backward. Under ``no_grad`` the derivative is not
computed. The output keeps the input's memory order.

Three implementations, one per back end; the numba and CUDA ones run ``FastGELU``'s code where
their kernel does not apply (the erf form, another dtype, the kernels switched off):

- ``FastGELU``: the chunked NumPy code above (and the same array code on CuPy);
- ``CompiledGELU`` (CPU, numba installed): the tanh form as one compiled pass writing y and
  dy/dx (``kernels/activation_numba.py``);
- ``CudaGELU`` (CUDA): the tanh form as one elementwise kernel (``kernels/activation_cuda.py``).
"""

from __future__ import annotations

import math

import numpy as np

from ..backend import array_module
from ..ops.activation import C0, C1, GELU
from ..ops.special import erfc
from . import compiled, cuda
from .engine import last_backward, take_saved
from .kernels import activation_cuda, activation_numba
from .layout import memory_order

__all__ = ["CompiledGELU", "CudaGELU", "FastGELU", "gelu_tanh_into"]

CHUNK = 1 << 16   # elements per chunk on the CPU (256 KiB of float32): temporaries stay in cache
_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


class FastGELU(GELU):
    """``GELU`` in chunks, with its derivative saved (see the module docstring)."""

    @staticmethod
    def forward(ctx, x, approximate=True):
        kernel = gelu_tanh_into if approximate else _gelu_erf_into
        y, dydx = _elementwise(kernel, x, want_derivative=ctx.needs_input_grad[0])
        ctx.save_for_backward(dydx)
        return y

    @staticmethod
    def backward(ctx, grad):
        (dydx,) = take_saved(ctx)
        if not last_backward(ctx):
            return grad * dydx
        return array_module(grad).multiply(grad, dydx, out=dydx)   # dy/dx's last use: its memory is free


class CompiledGELU(FastGELU):
    """GELU (tanh form) as one compiled pass writing y and dy/dx; the erf form is FastGELU's.

    It takes the bias a fast Linear leaves pending on its output (``takes_bias``): GELU(x W + b)
    is then one pass over x W, where it was two (the bias added, then GELU)."""

    @staticmethod
    def takes_bias(index, x, bias, kwargs):
        takes = kwargs.get("approximate", True) and x.size > 0 and compiled.applies(x, bias) and \
            activation_numba.bias_layout(x) is not None
        return "bias" if takes else None

    @staticmethod
    def forward(ctx, x, approximate=True, bias=None):
        done = activation_numba.gelu_tanh_bias(x, bias) if bias is not None and ctx.needs_input_grad[0] else None
        if bias is not None and done is None:
            x = x + bias                                 # x itself is the caller's: not written
        if done is None and approximate and compiled.applies(x) and x.size:
            done = activation_numba.gelu_tanh(x, want_derivative=ctx.needs_input_grad[0])
        if done is None:                                 # no kernel for x, or it failed
            return FastGELU.forward(ctx, x, approximate)
        y, dydx = done
        ctx.save_for_backward(dydx)
        return y

    @staticmethod
    def backward(ctx, grad):
        (dydx,) = take_saved(ctx)
        dx = activation_numba.gelu_backward(grad, dydx, overwrite=last_backward(ctx))
        if dx is not None:
            return dx
        return np.multiply(grad, dydx, out=dydx) if last_backward(ctx) else grad * dydx


class CudaGELU(FastGELU):
    """``GELU`` on CUDA: the tanh form as one kernel writing y and dy/dx."""

    @staticmethod
    def forward(ctx, x, approximate=True):
        want = ctx.needs_input_grad[0]
        if approximate and cuda.applies(x):
            y, dydx = activation_cuda.gelu_tanh_forward(x, want_derivative=want)
        else:
            y, dydx = _elementwise(gelu_tanh_into if approximate else _gelu_erf_into, x, want)
        ctx.save_for_backward(dydx)
        return y


def _elementwise(kernel, x, want_derivative):
    """Run ``kernel(x, y, d)`` (writing y = f(x) and d = f'(x)) over ``x``, in x's memory order;
    in chunks on the CPU."""
    xp = array_module(x)
    order = memory_order(x)
    xt = x.transpose(order)
    if not xt.flags.c_contiguous:
        xt = x = xp.ascontiguousarray(x)
        order = tuple(range(x.ndim))
    y = xp.empty_like(xt)
    d = xp.empty_like(xt) if want_derivative else None
    xf, yf = xt.reshape(-1), y.reshape(-1)
    df = d.reshape(-1) if d is not None else None
    step = CHUNK if xp is np else max(1, xf.size)
    for s in range(0, xf.size, step):
        kernel(xf[s:s + step], yf[s:s + step], df[s:s + step] if df is not None else None)
    back = tuple(np.argsort(order))
    return y.transpose(back), (d.transpose(back) if d is not None else None)


def gelu_tanh_into(x, y, d):
    """y = x (1 + tanh(c0 (x + c1 x^3)))/2 and, if d is given, d = dy/dx. y may be x itself.

    With t = tanh(u), h = (1 + t)/2 and (1 - t^2)/2 = h (1 - t): dy/dx = h + y (1 - t) du/dx.
    """
    xp = array_module(x)
    x2 = x * x
    t = x2 * (C0 * C1)
    t += C0
    t *= x                      # u = c0 x + c0 c1 x^3
    xp.tanh(t, out=t)           # t = tanh(u)
    h = t + 1
    h *= 0.5                    # h = (1 + t)/2
    xp.multiply(x, h, out=y)    # y = x h
    if d is not None:
        x2 *= 3 * C0 * C1
        x2 += C0                # du/dx = c0 (1 + 3 c1 x^2)
        xp.subtract(1, t, out=d)
        d *= y
        d *= x2
        d += h                  # d = h + y (1 - t) du/dx
        d[...] = xp.where(t * t == 1, h, d)     # saturated: dy/dx = h (0 * inf would be NaN)
    y[...] = xp.where(h == 0, h, y)             # far left: y = 0 (-inf * 0 would be NaN)


def _gelu_erf_into(x, y, d):
    """y = x Phi(x) and, if d is given, d = Phi(x) + x phi(x)."""
    xp = array_module(x)
    cdf = erfc(x * -_INV_SQRT2)
    cdf *= 0.5                  # Phi(x) = erfc(-x/sqrt 2)/2: accurate in the far left tail too
    xp.multiply(x, cdf, out=y)
    if d is not None:
        xp.multiply(x, x, out=d)
        d *= -0.5
        xp.exp(d, out=d)
        d *= _INV_SQRT_2PI      # phi(x)
        d *= x
        d += cdf
        d[...] = xp.where(xp.isinf(x), cdf, d)  # at +-inf: dy/dx = Phi(x) (inf * 0 would be NaN)
    y[...] = xp.where(cdf == 0, cdf, y)         # far left: y = 0 (-inf * 0 would be NaN)
