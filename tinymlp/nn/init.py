"""Initialisation of parameters, seeded through a ``numpy.random.Generator``.

Every function takes ``(target, rng=None, dtype=None)`` plus keyword-only settings, where
``target`` is either

* a shape: the function returns a new NumPy array (``dtype`` defaults to float32), or
* a ``Parameter`` (or any Tensor): the function overwrites its values *in place*, in its own
  dtype and on its own device, and returns it.

``rng`` is a Generator, an int seed, or None: the same seed gives the same weights. None
draws from tinymlp's default generator, which advances from layer to layer (two layers
built without ``rng`` get different weights) and which ``tinymlp.manual_seed(s)`` resets,
so a script that builds its layers in the same order is reproducible.
Random numbers are drawn on the CPU with NumPy and moved to the target's device, so a model
initialises identically on either device.

Fans. tinymlp stores a Linear weight as ``(in, out)`` (it computes ``x @ W``), so for a matrix
``fan_in = shape[0]`` and ``fan_out = shape[1]``; for more axes, the leading ones are a
receptive field multiplying both (the JAX convention: in = axis -2, out = axis -1).
"""

from __future__ import annotations

import math

import numpy as np

from ..backend import DEFAULT_FLOAT, to_device
from ..tensor import Tensor

__all__ = [
    "as_rng", "manual_seed", "constant", "fans", "lecun_normal", "normal", "ones", "trunc_normal", "uniform",
    "xavier_uniform", "zeros",
]

# std of a standard normal truncated to [-2, 2]; dividing by it restores the intended variance
_TRUNC2_STD = 0.87962566103423978


_default_generator = np.random.default_rng(0)


def manual_seed(seed: int) -> None:
    """Reset the default generator that layers built without ``rng`` draw from."""
    global _default_generator
    _default_generator = np.random.default_rng(seed)


def as_rng(rng=None) -> np.random.Generator:
    """A Generator from a Generator (returned as is), an int seed, or None (the default generator)."""
    if rng is None:
        return _default_generator
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        return np.random.default_rng(int(rng))
    raise TypeError(f"rng must be a numpy.random.Generator, an int seed or None, got {type(rng).__name__}")


def fans(shape) -> tuple[int, int]:
    """(fan_in, fan_out) of a weight of ``shape`` laid out (..., in, out)."""
    shape = tuple(shape)
    if len(shape) == 0:
        return 1, 1
    if len(shape) == 1:
        return shape[0], shape[0]
    receptive = math.prod(shape[:-2])
    return shape[-2] * receptive, shape[-1] * receptive


def _make(target, dtype, draw):
    """Shared plumbing: ``draw(shape) -> float64 array`` becomes a new array or an in-place fill."""
    if isinstance(target, Tensor):
        values = draw(target.shape).astype(target.dtype, copy=False)
        target.data[...] = to_device(values, target.device)
        return target
    shape = (target,) if isinstance(target, (int, np.integer)) else tuple(target)
    return draw(shape).astype(DEFAULT_FLOAT if dtype is None else dtype, copy=False)


def zeros(target, rng=None, dtype=None):
    """All zeros (``rng`` is accepted and unused, so every initialiser is called alike)."""
    return _make(target, dtype, lambda shape: np.zeros(shape))


def ones(target, rng=None, dtype=None):
    """All ones."""
    return _make(target, dtype, lambda shape: np.ones(shape))


def constant(target, rng=None, dtype=None, *, value: float):
    """Every element equal to ``value``."""
    return _make(target, dtype, lambda shape: np.full(shape, float(value)))


def uniform(target, rng=None, dtype=None, *, low: float = -1.0, high: float = 1.0):
    """U(low, high)."""
    gen = as_rng(rng)
    return _make(target, dtype, lambda shape: gen.uniform(low, high, size=shape))


def normal(target, rng=None, dtype=None, *, mean: float = 0.0, std: float = 1.0):
    """N(mean, std^2)."""
    gen = as_rng(rng)
    return _make(target, dtype, lambda shape: gen.normal(mean, std, size=shape))


def _truncated_standard_normal(gen, shape, bound):
    """N(0, 1) conditioned on |x| <= bound, by redrawing the values outside (about 5% at bound 2)."""
    x = gen.standard_normal(size=shape)
    outside = np.abs(x) > bound
    while outside.any():
        x[outside] = gen.standard_normal(size=int(outside.sum()))
        outside = np.abs(x) > bound
    return x


def trunc_normal(target, rng=None, dtype=None, *, mean: float = 0.0, std: float = 1.0, bound: float = 2.0):
    """N(mean, std^2) truncated to ``mean +- bound * std`` (bound counted in stds, as in JAX;
    note: timm's ``trunc_normal_`` takes absolute bounds instead). ``std`` is the std of the
    normal *before* truncation; the truncated values have a slightly smaller spread."""
    gen = as_rng(rng)
    return _make(target, dtype, lambda shape: mean + std * _truncated_standard_normal(gen, shape, bound))


def xavier_uniform(target, rng=None, dtype=None, *, gain: float = 1.0):
    """Glorot: U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out)), so Var = 2 / (fan_in + fan_out)."""
    gen = as_rng(rng)

    def draw(shape):
        fan_in, fan_out = fans(shape)
        a = gain * math.sqrt(6.0 / (fan_in + fan_out))
        return gen.uniform(-a, a, size=shape)

    return _make(target, dtype, draw)


def lecun_normal(target, rng=None, dtype=None):
    """LeCun: truncated normal (at 2 stds) with variance exactly 1 / fan_in (Flax's Dense default)."""
    gen = as_rng(rng)

    def draw(shape):
        fan_in, _ = fans(shape)
        std = math.sqrt(1.0 / fan_in) / _TRUNC2_STD
        return std * _truncated_standard_normal(gen, shape, 2.0)

    return _make(target, dtype, draw)
