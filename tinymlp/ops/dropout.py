"""Inverted dropout: zero each element with probability p during training, scale the rest by 1/(1-p).

With a random keep mask k (k = 1 with probability 1 - p, else 0) and m = k / (1 - p):

    out = x * m                  E[out] = x, so evaluation needs no rescaling: out = x.

The scaled mask m is drawn once in forward and saved; backward reuses it: dL/dx = g * m.
"""

from __future__ import annotations

import numpy as np

from ..autograd import Function
from ..backend import array_module

__all__ = ["Dropout", "dropout"]

_default_rngs = {}


def _default_rng(xp):
    """The generator used when none is given: one per array module, seeded from the OS."""
    if xp not in _default_rngs:
        _default_rngs[xp] = xp.random.default_rng()
    return _default_rngs[xp]


def _uniform(xp, rng, shape, dtype):
    """U[0, 1) samples of ``shape`` on ``xp``'s device, drawn from ``rng``."""
    draw_dtype = dtype if dtype in (np.float32, np.float64) else np.float64
    if rng is None:
        rng = _default_rng(xp)
    elif xp is not np and isinstance(rng, np.random.Generator):
        rng = _device_rng(xp, rng)
    return rng.random(shape, dtype=draw_dtype)


_device_rngs = {}   # id(host generator) -> (host generator, {device id: device generator}), oldest first
MAX_DEVICE_RNGS = 4
"""How many host generators keep a device generator (each holds megabytes of cuRAND state:
about 13 MB on an H100); the least recently used one is dropped beyond that."""


def _device_rng(xp, host_rng):
    """A NumPy generator driving GPU tensors: one device generator per host generator (and
    device), seeded once from it, so that each forward draws its mask on the device without
    building a new generator every time. Only the ``MAX_DEVICE_RNGS`` most recently used host
    generators keep theirs; a dropped one is reseeded from its host generator when used again."""
    key = id(host_rng)
    entry = _device_rngs.pop(key, None)
    if entry is None or entry[0] is not host_rng:  # an id can be reused once a generator is freed
        entry = (host_rng, {})
    _device_rngs[key] = entry                       # most recently used last
    while len(_device_rngs) > MAX_DEVICE_RNGS:
        del _device_rngs[next(iter(_device_rngs))]
    per_device = entry[1]
    device = int(xp.cuda.Device().id)
    if device not in per_device:
        per_device[device] = xp.random.default_rng(int(host_rng.integers(2**63)))
    return per_device[device]


class Dropout(Function):
    """out = x * m with the saved scaled mask m = keep / (1 - p);  dL/dx = g * m.

    Forward is random: two calls give two masks. A gradient check must fix the mask, by passing
    a freshly seeded ``rng`` on every call (or reseeding in ``before_forward``).
    """

    @staticmethod
    def forward(ctx, x, p, rng=None):
        xp = array_module(x)
        mask = (_uniform(xp, rng, x.shape, x.dtype) >= p).astype(x.dtype)
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
    """
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
        raise ValueError(f"dropout: p must be a probability in [0, 1), got {p!r}")
    if rng is not None and not hasattr(rng, "random"):
        raise TypeError(f"dropout: rng must be a random Generator (np.random.default_rng(seed)) or None, "
                        f"got {type(rng).__name__}")
    if not training or p == 0:
        return x
    return Dropout.apply(x, float(p), rng=rng)
