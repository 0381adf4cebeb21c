"""GELU (tanh form) on CUDA: y and dy/dx from one tanh, in one elementwise kernel.

On the GPU every NumPy-style line (``t = x * x``, ``t += 1``, ``tanh(t, out=t)``, ...) is one
kernel launch and one trip of the whole array through GPU memory; GELU is memory bound, so one
kernel that reads x once and writes y and dy/dx once is several times faster than the formula
written with arrays. The backward, G * dy/dx, is one CuPy multiply already.
"""

from __future__ import annotations

import numpy as np

from ...ops.activation import C0, C1
from .. import cuda

__all__ = ["gelu_backward", "gelu_tanh_forward"]

# y = x h, h = (1 + t)/2, t = tanh(c0 (x + c1 x^3));  dy/dx = h + y (1 - t) c0 (1 + 3 c1 x^2)
# (the derivation is in ops/activation.py); where t is -1 or 1, the limits (0, 0) and (x, 1), as
# the products would be NaN at +-inf. Constants are cast to T, so float32 stays float32.
GELU_BODY = f"""
    const T x2 = x * x;
    const T t = tanh(T({C0!r}) * (x + T({C1!r}) * x2 * x));
    const T h = T(0.5) * (T(1) + t);
    y = h == T(0) ? h : x * h;
"""
GELU_DERIVATIVE = f"""
    dydx = t * t == T(1) ? h : h + y * (T(1) - t) * (T({C0!r}) + T({3 * C0 * C1!r}) * x2);
"""


def _gelu_kernel(with_derivative):
    if with_derivative:
        return cuda.elementwise("T x", "T y, T dydx", GELU_BODY + GELU_DERIVATIVE, "tinymlp_gelu_tanh_grad")
    return cuda.elementwise("T x", "T y", GELU_BODY, "tinymlp_gelu_tanh")


def gelu_tanh_forward(x, want_derivative=True):
    """GELU (tanh form) of ``x`` and its derivative, both from one tanh: ``(y, dydx)``.

    With ``want_derivative=False`` (no gradient needed) only y is computed: ``(y, None)``.
    """
    cuda.check("gelu_tanh_forward", x)
    if want_derivative:
        y, dydx = _gelu_kernel(True)(x)
        return y, dydx
    return _gelu_kernel(False)(x), None


def gelu_backward(g, dydx):
    """dL/dx = g * dy/dx: a single elementwise multiply, already one kernel; no custom code needed."""
    return g * dydx


@cuda.self_test
def _self_test(dtype):
    cp = cuda.cupy()
    x = np.linspace(-6, 6, 37).reshape(1, 37)
    t = np.tanh(C0 * (x + C1 * x**3))
    h = 0.5 * (1 + t)
    y, dydx = gelu_tanh_forward(cp.asarray(x, dtype=dtype), want_derivative=True)
    y_only, _ = gelu_tanh_forward(cp.asarray(x, dtype=dtype), want_derivative=False)
    return [("GELU", y, x * h), ("GELU without its derivative", y_only, x * h),
            ("GELU's derivative", dydx, h + x * h * (1 - t) * (C0 + 3 * C0 * C1 * x * x))]
