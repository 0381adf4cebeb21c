"""Inverted dropout: zero each element with probability p during training, scale the rest by 1/(1-p).

With a random keep mask k (k = 1 with probability 1 - p, else 0) and m = k / (1 - p):

    out = x * m                  E[out] = x, so evaluation needs no rescaling: out = x.

The scaled mask m is drawn once in forward and saved; backward reuses it: dL/dx = g * m.
"""

from __future__ import annotations

import numpy as np

from ..autograd import Function
from ..backend import array_module

__all__ = ["DEFAULT_RNG", "Dropout", "dropout", "uniform"]

DEFAULT_RNG = np.random.default_rng()
"""The generator used when none is given (seeded from the OS), for tensors on either device."""


def uniform(xp, rng, shape, dtype):
    """U[0, 1) samples of ``shape`` for a tensor on ``xp``'s device, drawn from ``rng``.

    A NumPy generator (or None: ``DEFAULT_RNG``) draws on the host, so that a tensor gets the
    same numbers on either device (on a GPU they are uploaded), and a run resumed from a
    checkpoint, which restores the generator's state, draws what the uninterrupted run would
    have. A CuPy generator draws on the GPU."""
    draw_dtype = dtype if dtype in (np.float32, np.float64) else np.float64
    u = (DEFAULT_RNG if rng is None else rng).random(shape, dtype=draw_dtype)
    return u if xp is np or isinstance(u, xp.ndarray) else xp.asarray(u)


class Dropout(Function):
    """out = x * m with the saved scaled mask m = keep / (1 - p);  dL/dx = g * m.

    Forward is random: two calls give two masks. A gradient check must fix the mask, by passing
    a freshly seeded ``rng`` on every call (or reseeding in ``before_forward``).
    """

    @staticmethod
    def forward(ctx, x, p, rng=None):
        xp = array_module(x)
        mask = (uniform(xp, rng, x.shape, x.dtype) >= p).astype(x.dtype)
        mask *= 1 / (1 - p)
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved_tensors
        return g * mask


def dropout(x, p, training=True, rng=None):
    """Inverted dropout of ``x`` with drop probability ``p`` in [0, 1).

    Identity (``x`` itself) when ``training`` is False or ``p == 0``. ``rng``: a NumPy
    ``Generator`` (or a CuPy one for CUDA tensors); None uses a generator seeded from the OS.
    On a GPU the fast tier draws the mask on the device from a seed the NumPy generator gives
    (``tinymlp/fast/dropout.py``).
    """
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
        raise ValueError(f"dropout: p must be a probability in [0, 1), got {p!r}")
    if rng is not None and not hasattr(rng, "random"):
        raise TypeError(f"dropout: rng must be a random Generator (np.random.default_rng(seed)) or None, "
                        f"got {type(rng).__name__}")
    if not training or p == 0:
        return x
    return Dropout.apply(x, float(p), rng=rng)
