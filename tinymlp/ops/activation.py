"""GELU, the smooth ReLU of Transformers and MLP-Mixer, in its tanh form and its exact erf form.

Elementwise ops cost memory traffic, not arithmetic: a naive GELU makes about 15 passes over
its input. Here every step writes into an array it already owns (``out=``), the cube is
``x*x*x`` (NumPy's ``x**3`` is ~150x slower), and on the CPU the input is processed in chunks
of 64K elements so that the temporaries stay in cache.
"""

from __future__ import annotations

import math

import numpy as np

from ..autograd import Function
from ..backend import array_module
from . import cuda_kernels

_C0 = math.sqrt(2.0 / math.pi)  # sqrt(2/pi)
_C1 = 0.044715
_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_CHUNK = 1 << 16  # elements per chunk on the CPU (256 KiB of float32): temporaries stay in cache


class GELU(Function):
    r"""y = GELU(x), elementwise; two forms.

    Tanh form (``approximate=True``, official MLP-Mixer, Flax): with
    u = c0 (x + c1 x^3), c0 = sqrt(2/pi), c1 = 0.044715, t = tanh(u), h = (1 + t)/2:

        y = x h
        dy/dx = h + x dh/dx = h + x (1 - t^2)/2 * du/dx,   du/dx = c0 (1 + 3 c1 x^2)
              = h + y (1 - t) du/dx                        (because (1 - t^2)/2 = h (1 - t))

    Exact form (``approximate=False``, PyTorch's default): with Phi the standard normal CDF
    and phi its density,

        y = x Phi(x),      dy/dx = Phi(x) + x phi(x),   phi(x) = exp(-x^2/2) / sqrt(2 pi).

    Backward: dL/dx = g * dy/dx. The forward pass already holds t (or Phi), so it computes
    dy/dx on the spot and saves it: backward is then a single multiply. (Saving x and t and
    rebuilding dy/dx in backward takes ~20% longer at the Mixer's sizes, measured.) Under
    ``no_grad`` the derivative is not computed at all. On CUDA the tanh form runs as one fused
    kernel (``cuda_kernels.gelu_tanh_forward``, tested against ``_gelu_tanh`` below).
    """

    @staticmethod
    def forward(ctx, x, approximate=True):
        want = ctx.needs_input_grad[0]
        if approximate and cuda_kernels.applies(x):
            y, dydx = cuda_kernels.gelu_tanh_forward(x, want_derivative=want)
        else:
            kernel = _gelu_tanh if approximate else _gelu_erf
            y, dydx = _elementwise(kernel, x, want_derivative=want)
        ctx.save_for_backward(dydx)
        return y

    @staticmethod
    def backward(ctx, grad):
        (dydx,) = ctx.saved_tensors
        return grad * dydx


def gelu(x, approximate=True):
    """GELU activation: the tanh form by default, the exact erf form with ``approximate=False``."""
    return GELU.apply(x, approximate=bool(approximate))


def gelu_epilogue(u, bias=None, want_derivative=True):
    """(GELU(u + bias), dGELU/du at u + bias) in the tanh form, computed *in place* in u on the CPU.

    The last steps of a Linear followed by GELU (``F.linear(..., activation="gelu")``): the
    matrix product has just written u, a fresh array nobody else holds, so the bias add, the
    activation and its derivative run in one chunked pass over it, and the output takes u's
    memory (one large array fewer than ``gelu(linear(x, W, b))``, and two passes fewer over
    it). ``u`` has at least one axis; ``bias`` broadcasts against it, and when its leading axis
    matches u's (one bias per row, as for ``axis=0``) each chunk of rows takes its own rows of
    the bias. Returns ``(y, d)``: y is u itself on the CPU; d is None unless ``want_derivative``.
    Tested against ``gelu(linear(...))`` in tests/test_fast_paths.py.
    """
    xp = array_module(u)
    if cuda_kernels.applies(u):   # one fused kernel; y is a new array
        if bias is not None:
            u += bias
        return cuda_kernels.gelu_tanh_forward(u, want_derivative=want_derivative)
    d = xp.empty(u.shape, dtype=u.dtype) if want_derivative else None
    per_row = bias is not None and bias.ndim == u.ndim and bias.shape[0] == u.shape[0] > 1
    rows = max(1, _CHUNK // max(1, u[0].size))     # whole rows of u (its first axis) per chunk
    for s in range(0, u.shape[0], rows):
        piece = u[s:s + rows]
        if bias is not None:
            piece += bias[s:s + rows] if per_row else bias
        _gelu_tanh(piece, piece, d[s:s + rows] if d is not None else None)
    return u, d


# ----------------------------------------------------------------------------- kernels
def _elementwise(kernel, x, want_derivative):
    """Run ``kernel(x, y, d)`` (writing y = f(x) and d = f'(x)) over ``x``; chunked on the CPU."""
    xp = array_module(x)
    y = xp.empty(x.shape, dtype=x.dtype)
    d = xp.empty(x.shape, dtype=x.dtype) if want_derivative else None
    if array_module(x) is not np or x.size <= _CHUNK:
        kernel(x, y, d)
        return y, d
    xf, yf = x.reshape(-1), y.reshape(-1)  # y is fresh, so reshape is a view
    df = d.reshape(-1) if d is not None else None
    for s in range(0, xf.size, _CHUNK):
        e = s + _CHUNK
        kernel(xf[s:e], yf[s:e], df[s:e] if df is not None else None)
    return y, d


def _gelu_tanh(x, y, d):
    """y = x (1 + tanh(c0 (x + c1 x^3)))/2 and, if d is given, d = dy/dx (see GELU).
    y may be x itself (x is not read after y is written)."""
    xp = array_module(x)
    x2 = x * x
    t = x2 * (_C0 * _C1)
    t += _C0
    t *= x                      # u = c0 x + c0 c1 x^3
    xp.tanh(t, out=t)           # t = tanh(u)
    h = t + 1
    h *= 0.5                    # h = (1 + t)/2
    xp.multiply(x, h, out=y)    # y = x h
    if d is not None:
        x2 *= 3 * _C0 * _C1
        x2 += _C0               # du/dx = c0 (1 + 3 c1 x^2)
        xp.subtract(1, t, out=d)
        d *= y
        d *= x2
        d += h                  # d = h + y (1 - t) du/dx


def _gelu_erf(x, y, d):
    """y = x Phi(x) and, if d is given, d = Phi(x) + x phi(x) (see GELU)."""
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


# ----------------------------------------------------------------------------- erf / erfc
# W. J. Cody, "Rational Chebyshev approximations for the error function",
# Math. Comp. 23 (1969) 631-638; the coefficients of Netlib SPECFUN's CALERF.
# One rational function on each of three intervals: |x| <= 0.46875 (erf), 0.46875 < |x| <= 4
# and |x| > 4 (erfc). Relative error below 1e-15 in float64, measured against math.erf and
# math.erfc on [-30, 30] (tests/test_activation.py checks it); float32 inputs are computed
# in float32 (relative error ~1e-7).
_ERF_A = (3.16112374387056560e00, 1.13864154151050156e02, 3.77485237685302021e02,
          3.20937758913846947e03, 1.85777706184603153e-1)
_ERF_B = (2.36012909523441209e01, 2.44024637934444173e02, 1.28261652607737228e03,
          2.84423683343917062e03)
_ERF_C = (5.64188496988670089e-1, 8.88314979438837594e00, 6.61191906371416295e01,
          2.98635138197400131e02, 8.81952221241769090e02, 1.71204761263407058e03,
          2.05107837782607147e03, 1.23033935479799725e03, 2.15311535474403846e-8)
_ERF_D = (1.57449261107098347e01, 1.17693950891312499e02, 5.37181101862009858e02,
          1.62138957456669019e03, 3.29079923573345963e03, 4.36261909014324716e03,
          3.43936767414372164e03, 1.23033935480374942e03)
_ERF_P = (3.05326634961232344e-1, 3.60344899949804439e-1, 1.25781726111229246e-1,
          1.60837851487422766e-2, 6.58749161529837803e-4, 1.63153871373020978e-2)
_ERF_Q = (2.56852019228982242e00, 1.87295284992346047e00, 5.27905102951428412e-1,
          6.05183413124413191e-2, 2.33520497626869185e-3)
_INV_SQRT_PI = 1.0 / math.sqrt(math.pi)


def _rational(num, den, z):
    """(num[-1] z^n + num[0] z^(n-1) + ... + num[-2]) / (z^n + den[0] z^(n-1) + ... + den[-1]),
    Horner's scheme in Cody's coefficient order."""
    xnum = num[-1] * z
    xden = z.copy()
    for a, b in zip(num[:-2], den[:-1]):
        xnum += a
        xnum *= z
        xden += b
        xden *= z
    return (xnum + num[-2]) / (xden + den[-1])


def _exp_minus_square(y):
    """exp(-y^2) without the rounding error of squaring first: y = y0 + r with y0 a multiple of
    1/16, so y0^2 is exact and exp(-y^2) = exp(-y0^2) exp(-(y - y0)(y + y0))."""
    xp = array_module(y)
    y0 = xp.trunc(y * 16) / 16
    return xp.exp(-y0 * y0) * xp.exp(-(y - y0) * (y + y0))


def erfc(x):
    """The complementary error function 1 - erf(x), elementwise, accurate to 1e-15 relative
    (float64) also where erf(x) is close to 1; keeps the dtype of ``x``."""
    xp = array_module(x)
    if xp.__name__ != "numpy":
        from cupyx.scipy.special import erfc as cupy_erfc  # noqa: PLC0415 - CUDA only

        return cupy_erfc(x)
    shape = xp.shape(x)
    x = xp.asarray(x).reshape(-1)  # 1-D, so that 0-d inputs can be indexed by masks too
    y = xp.abs(x)
    out = xp.empty_like(y)
    small = y <= 0.46875
    mid = (y > 0.46875) & (y <= 4.0)
    big = y > 4.0
    if small.any():
        out[small] = 1 - _erf_small(x[small])
    if mid.any():
        ym = y[mid]
        out[mid] = _exp_minus_square(ym) * _rational(_ERF_C, _ERF_D, ym)
    if big.any():
        yb = xp.minimum(y[big], 30.0)  # erfc(30) underflows to 0 anyway; keeps inf - inf away
        z = 1 / (yb * yb)
        r = z * _rational(_ERF_P, _ERF_Q, z)
        out[big] = _exp_minus_square(yb) * ((_INV_SQRT_PI - r) / yb)
    negative = (x < 0) & ~small
    out[negative] = 2 - out[negative]
    out[xp.isnan(x)] = xp.nan
    return out.reshape(shape)


def erf(x):
    """The error function, elementwise, accurate to 1e-15 relative (float64); keeps the dtype."""
    xp = array_module(x)
    if xp.__name__ != "numpy":
        from cupyx.scipy.special import erf as cupy_erf  # noqa: PLC0415 - CUDA only

        return cupy_erf(x)
    shape = xp.shape(x)
    x = xp.asarray(x).reshape(-1)
    small = xp.abs(x) <= 0.46875
    out = 1 - erfc(x)  # no cancellation to fear away from 0, where |erf| > 0.49
    out[small] = _erf_small(x[small])
    return out.reshape(shape)


def _erf_small(x):
    """erf(x) for |x| <= 0.46875: x P(x^2)/Q(x^2)."""
    return x * _rational(_ERF_A, _ERF_B, x * x)
