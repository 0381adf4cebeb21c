"""Adam/AdamW's update on the CPU, compiled by numba: the direction over the flat buffers in one
pass, and each parameter's update p <- p (1 - lr wd) - step in one; or both at once, the whole
step over every parameter, ``BATCH`` parameters per launch in pieces of ``PIECE`` values.

The fast tier's ``CompiledFlatStep`` (fast/optim.py) calls them; the arithmetic, in the same
order and dtype, is that of ``adam_direction`` there (the paper's cheaper form).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from .. import compiled
from ..compiled import prange

__all__ = ["BATCH", "adam_direction", "adam_step", "apply_update"]


def _moments(gi, mi, vi, b1, one_b1, b2, one_b2, eps_c, step):
    # one value: m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2;  its direction
    # step m / (sqrt(v) + eps sqrt(c2)); returns (m, v, direction)
    mi = mi * b1 + gi * one_b1
    vi = vi * b2 + (gi * gi) * one_b2
    return mi, vi, mi / (np.sqrt(vi) + eps_c) * step


moments = compiled.inline(_moments)


def _adam(g, m, v, out, b1, one_b1, b2, one_b2, eps_c, step):
    # the moments and the direction over the flat buffers
    for i in prange(g.shape[0]):
        m[i], v[i], out[i] = moments(g[i], m[i], v[i], b1, one_b1, b2, one_b2, eps_c, step)


def _apply_update(p, u, decay):
    for i in prange(p.shape[0]):
        p[i] = p[i] * decay - u[i]


def _adam_step(ps, starts, pieces, g, m, v, u, b1, one_b1, b2, one_b2, eps_c, step, decay):
    # piece r = (k, lo, hi): values lo:hi of parameter k, ps[k] (flat), which lies at starts[k] in the
    # flat buffers: _adam's direction into u, then _apply_update's p <- p decay - u, over that slice
    # (two short loops that vectorise; pieces of one size share the cores evenly)
    for r in prange(pieces.shape[0]):
        k = pieces[r, 0]
        lo = pieces[r, 1]
        hi = pieces[r, 2]
        p = ps[k][lo:hi]
        at = starts[k] + lo
        n = hi - lo
        gk, mk, vk, uk = g[at:at + n], m[at:at + n], v[at:at + n], u[at:at + n]
        for j in range(n):
            mk[j], vk[j], uk[j] = moments(gk[j], mk[j], vk[j], b1, one_b1, b2, one_b2, eps_c, step)
        for j in range(n):
            p[j] = p[j] * decay - uk[j]


ADAM = compiled.jit(_adam)
APPLY_UPDATE = compiled.jit(_apply_update)
ADAM_STEP = compiled.jit(_adam_step)

BATCH = 16
"""Parameters per launch of the whole step: the kernel takes them as a tuple of this many arrays
(padded with empty ones), so that one compiled version serves any number of parameters."""

PIECE = 8192
"""Values per piece of work of the whole step: a large parameter is cut into pieces, so that the
cores share a launch evenly."""


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


def adam_step(params, starts, g, m, v, work, group, t, decay):
    """A whole Adam(W) step: for each parameter array in ``params`` (C-contiguous; parameter k at
    ``starts[k]`` in the flat buffers g, m, v and ``work``, which receives the direction), the
    moments, the direction and p <- p * decay - step in one pass, ``BATCH`` parameters per launch,
    in pieces of at most ``PIECE`` values. False where a kernel does not apply or failed (only the
    first launch can fail, in compiling or loading, before it writes anything)."""
    if not (params and compiled.applies(g, m, v, work, *params) and all(p.flags.c_contiguous for p in params)):
        return False
    b1, b2 = (float(b) for b in group["betas"])
    c1, root_c2 = 1.0 - b1**t, math.sqrt(1.0 - b2**t)
    s = g.dtype.type
    consts = (s(b1), s(1.0 - b1), s(b2), s(1.0 - b2), s(float(group["eps"]) * root_c2),
              s(float(group["lr"]) * root_c2 / c1), s(decay))
    flat = [p.reshape(-1) for p in params]
    pad = np.empty(0, dtype=g.dtype)
    try:
        for a in range(0, len(flat), BATCH):
            batch = flat[a:a + BATCH]
            ps = tuple(batch) + (pad,) * (BATCH - len(batch))
            sizes = tuple(p.size for p in batch)
            at, pieces = _layout(tuple(starts[a:a + BATCH]), sizes)
            compiled.kernel(ADAM_STEP, sum(sizes))(ps, at, pieces, g, m, v, work, *consts)
    except compiled.KernelFailed:
        return False
    return True


@functools.lru_cache(maxsize=64)
def _layout(starts, sizes):
    """``(at, pieces)`` for one batch, made once per layout (the kernel only reads them): ``at``,
    where each array k starts in the flat buffers (padded to ``BATCH``), and (k, lo, hi) rows, each
    array of ``sizes[k]`` values cut into runs of at most ``PIECE`` values."""
    at = np.array(starts + (0,) * (BATCH - len(starts)), dtype=np.int64)
    rows = [(k, lo, min(lo + PIECE, n)) for k, n in enumerate(sizes) for lo in range(0, n, PIECE)]
    return at, np.array(rows, dtype=np.int64).reshape(-1, 3)
