"""Add, compiled: the residual sum that also adds a bias one of its inputs still lacks.

The fast Linear leaves its bias pending where the compiled kernels take its output (see
fast/linear.py): the op after it adds the bias in its own pass. After a block's last Linear
that op is the residual sum, x + (h W + b): ``CompiledAdd`` computes it as one pass over x and
h W (``kernels/elementwise_numba.py``), where it was two (the bias added into h W, then the sum),
on either input (the sum is symmetric). The value is the reference's to the bit; backward is
``Add``'s.
"""

from __future__ import annotations

import numpy as np

from ..ops.elementwise import Add
from . import compiled
from .kernels import elementwise_numba
from .layout import memory_order

__all__ = ["CompiledAdd"]


class CompiledAdd(Add):
    """``Add`` that takes an input's pending bias (``takes_bias``) into one compiled pass."""

    @staticmethod
    def takes_bias(index, x, bias, kwargs):
        takes = x.ndim > 0 and x.size > 0 and compiled.applies(x, bias) and memory_order(x)[-1] == x.ndim - 1
        return ("a_bias", "b_bias")[index] if takes else None

    @staticmethod
    def forward(ctx, a, b, a_bias=None, b_bias=None):
        if a_bias is None and b_bias is None:
            return Add.forward(ctx, a, b)
        ctx.shapes = np.shape(a), np.shape(b)
        if a_bias is not None and b_bias is not None:
            b = b + b_bias                               # both pending: b's added first (a new array)
        p, bias, q = (a, a_bias, b) if a_bias is not None else (b, b_bias, a)
        out = elementwise_numba.add_bias(p, bias, q)
        return out if out is not None else (p + bias) + q
