"""GELU, the smooth ReLU of Transformers and MLP-Mixer, in its tanh form and its exact erf form.

Fast tier: ``tinymlp/fast/activation.py`` (in-cache chunks, in-place steps, the derivative
computed in forward; one fused kernel on CUDA).
"""

from __future__ import annotations

import math

from ..autograd import Function
from ..backend import array_module
from .special import erf, erfc

__all__ = ["GELU", "gelu", "erf", "erfc"]

C0 = math.sqrt(2.0 / math.pi)   # sqrt(2/pi)
C1 = 0.044715


class GELU(Function):
    r"""y = GELU(x), elementwise; two forms.

    Tanh form (``approximate=True``, official MLP-Mixer, Flax): with
    u = c0 (x + c1 x^3), c0 = sqrt(2/pi), c1 = 0.044715, t = tanh(u):

        y = x (1 + t) / 2
        dy/dx = (1 + t)/2 + x (1 - t^2)/2 * du/dx,     du/dx = c0 (1 + 3 c1 x^2)

    Exact form (``approximate=False``, PyTorch's default): with Phi the standard normal CDF
    and phi its density,

        y = x Phi(x),      dy/dx = Phi(x) + x phi(x),   phi(x) = exp(-x^2/2) / sqrt(2 pi).

    Backward: dL/dx = G * dy/dx, elementwise. Forward saves x; backward rebuilds t (or Phi).

    Far out, the limits: y -> 0 and dy/dx -> 0 on the left, y = x and dy/dx -> 1 on the right.
    Where (1 + t) or Phi has reached 0, and where t has reached +-1 (|x| past about 10), the
    formulas' products x * 0 and 0 * x^2 become NaN at x = +-inf (or once x^2 overflows): there
    the limits are written in their place.
    """

    @staticmethod
    def forward(ctx, x, approximate=True):
        xp = array_module(x)
        if approximate:
            t = xp.tanh(C0 * (x + C1 * x * x * x))
            y = xp.where(t == -1, 0, x * (1 + t) / 2)
        else:
            cdf = Phi(x)
            y = xp.where(cdf == 0, 0, x * cdf)
        ctx.save_for_backward(x)
        ctx.approximate = approximate
        return y

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        xp = array_module(x)
        if ctx.approximate:
            t = xp.tanh(C0 * (x + C1 * x * x * x))
            dydx = (1 + t) / 2 + x * (1 - t * t) / 2 * C0 * (1 + 3 * C1 * x * x)
            dydx = xp.where(xp.abs(t) == 1, (1 + t) / 2, dydx)
        else:
            dydx = Phi(x) + x * xp.exp(-x * x / 2) / math.sqrt(2 * math.pi)
            dydx = xp.where(xp.isinf(x), Phi(x), dydx)
        return grad * dydx


def Phi(x):
    """The standard normal CDF, erfc(-x / sqrt 2) / 2 (accurate in the far left tail too)."""
    return erfc(-x / math.sqrt(2.0)) / 2


def gelu(x, approximate=True):
    """GELU activation: the tanh form by default, the exact erf form with ``approximate=False``."""
    return GELU.apply(x, approximate=bool(approximate))
