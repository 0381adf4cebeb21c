"""Adam/AdamW's update on the CPU, compiled by numba: the direction over the flat buffers in one
pass, and each parameter's update p <- p (1 - lr wd) - step in one.

The fast tier's ``CompiledFlatStep`` (fast/optim.py) calls them; the arithmetic, in the same
order and dtype, is that of ``adam_direction`` there (the paper's cheaper form).
"""

from __future__ import annotations

import math

import numpy as np

from .. import compiled
from ..compiled import prange

__all__ = ["adam_direction", "apply_update"]


def _adam(g, m, v, out, b1, one_b1, b2, one_b2, eps_c, step):
    # m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2;  out <- step m / (sqrt(v) + eps sqrt(c2))
    for i in prange(g.shape[0]):
        gi = g[i]
        mi = m[i] * b1 + gi * one_b1
        vi = v[i] * b2 + (gi * gi) * one_b2
        m[i] = mi
        v[i] = vi
        out[i] = mi / (np.sqrt(vi) + eps_c) * step


def _apply_update(p, u, decay):
    for i in prange(p.shape[0]):
        p[i] = p[i] * decay - u[i]


ADAM = compiled.jit(_adam)
APPLY_UPDATE = compiled.jit(_apply_update)


def adam_direction(group, g, bufs, out, t):
    """``fast.optim.adam_direction`` in one compiled pass (same arithmetic, same dtype); False
    where the kernel failed (``compiled.KernelFailed``: it wrote nothing)."""
    b1, b2 = (float(b) for b in group["betas"])
    c1, root_c2 = 1.0 - b1**t, math.sqrt(1.0 - b2**t)
    s = g.dtype.type
    try:
        compiled.kernel(ADAM, g.size)(g, bufs["exp_avg"], bufs["exp_avg_sq"], out, s(b1), s(1.0 - b1), s(b2),
                                      s(1.0 - b2), s(float(group["eps"]) * root_c2),
                                      s(float(group["lr"]) * root_c2 / c1))
    except compiled.KernelFailed:
        return False
    return True


def apply_update(p, u, decay):
    """p <- p * decay - u in one pass (False where a kernel does not apply or failed)."""
    if not (compiled.applies(p, u) and p.flags.c_contiguous and u.flags.c_contiguous):
        return False
    try:
        compiled.kernel(APPLY_UPDATE, p.size)(p.reshape(-1), u.reshape(-1), p.dtype.type(decay))
    except compiled.KernelFailed:
        return False
    return True
