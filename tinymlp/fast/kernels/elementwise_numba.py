"""Sums on the CPU, compiled by numba: a residual and a Linear's output with its bias, in one pass.

``add_bias(p, bias, q)`` is (p + bias) + q, the bias along the last axis, which is the fastest
in memory: the residual stream x + (h W + b) where the fast Linear left b pending. It rounds as
the two NumPy additions do (p + bias first), so the result is the reference's to the bit. The
fast tier's ``CompiledAdd`` (fast/elementwise.py) calls it; it returns None where the arrays do
not suit the kernel (then the caller adds in NumPy).
"""

from __future__ import annotations

import numpy as np

from .. import compiled
from ..compiled import prange
from ..layout import inverse, memory_order

__all__ = ["add_bias"]


def _add_bias(p, q, bias, out, rows, cols):
    # out = (p + bias) + q on rows of width cols; the bias along the row
    for i in prange(rows):
        pr = p[i * cols:i * cols + cols]
        qr = q[i * cols:i * cols + cols]
        orow = out[i * cols:i * cols + cols]
        for j in range(cols):
            orow[j] = (pr[j] + bias[j]) + qr[j]


ADD_BIAS = compiled.jit(_add_bias)


def add_bias(p, bias, q):
    """(p + bias) + q in one pass, laid out like p, for p and q of one shape and one memory
    layout in which the last axis is the fastest (contiguous in that order); None otherwise, or
    where the kernel failed."""
    if not isinstance(q, np.ndarray) or p.shape != q.shape or not p.size or p.ndim == 0 or \
            not compiled.applies(p, q, bias):
        return None
    order = memory_order(p)
    pt, qt = p.transpose(order), q.transpose(order)
    if order[-1] != p.ndim - 1 or not pt.flags.c_contiguous or qt.strides != pt.strides:
        return None
    cols = p.shape[-1]
    out = np.empty(pt.shape, dtype=p.dtype)
    try:
        compiled.kernel(ADD_BIAS, p.size)(pt.reshape(-1), qt.reshape(-1), np.ascontiguousarray(bias),
                                          out.reshape(-1), p.size // cols, cols)
    except compiled.KernelFailed:
        return None
    return out.transpose(inverse(order))
