"""The error function and its complement, elementwise on NumPy or CuPy arrays (the exact GELU
needs Phi(x) = erfc(-x / sqrt 2) / 2; NumPy has no erf of its own).
"""

from __future__ import annotations

import math

from ..backend import array_module

__all__ = ["erf", "erfc"]

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
