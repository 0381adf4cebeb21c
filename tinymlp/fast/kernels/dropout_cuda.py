"""Dropout on CUDA: the mask drawn inside the kernel that applies it, from a seed and each
element's index, so that nothing is stored between forward and backward.

    dropout_apply(x, seed, p) -> x * m          m_i = 1/(1-p) if u_i >= p else 0,
                                                u_i = hash(seed, i) in [0, 1)

The hash is SplitMix64 (Steele, Lea and Flood, 2014) of ``seed + i * golden``: a bijection of
64-bit integers whose output bits pass the usual tests of randomness, so the u_i of one seed are
as good as draws from a generator for dropping elements, and cost a few integer operations. The
backward applies the same mask to the gradient by calling the kernel again with the same seed;
``i`` is the element's position in C order, whatever the array's layout, so forward and backward
(and any layout of x and g) agree. A seed comes from the layer's NumPy generator on the host: a
run resumed from a checkpoint (which restores the generator) draws the masks the uninterrupted
run would have.
"""

from __future__ import annotations

import numpy as np

from .. import cuda

__all__ = ["dropout_apply", "hash_uniform"]

GOLDEN = 0x9E3779B97F4A7C15
MIX1, MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB

_BODY = f"""
    unsigned long long z = seed + (unsigned long long)i * {GOLDEN}ULL;
    z = (z ^ (z >> 30)) * {MIX1}ULL;
    z = (z ^ (z >> 27)) * {MIX2}ULL;
    z ^= z >> 31;
    const double u = (double)(z >> 11) * (1.0 / 9007199254740992.0);
    y = u >= p ? x * scale : T(0);
"""


def dropout_apply(x, seed, p):
    """``x`` times the mask of ``seed`` (``x * m``, m = 1/(1-p) where u >= p, else 0), a new array.
    ``seed``: an int, or a 0-d uint64 device array (a slot a captured step reads its seed from)."""
    cuda.check("dropout_apply", x)
    if not isinstance(seed, int):
        if not (isinstance(seed, cuda.cupy().ndarray) and seed.shape == () and seed.dtype == np.uint64):
            raise TypeError(f"dropout_apply: seed must be an int or a 0-d uint64 CuPy array, got {seed!r}")
    else:
        seed = np.uint64(seed)
    kernel = cuda.elementwise("T x, uint64 seed, float64 p, T scale", "T y", _BODY, "tinymlp_dropout")
    return kernel(x, seed, np.float64(p), x.dtype.type(1.0 / (1.0 - p)))


def hash_uniform(seed, size):
    """The u_i of ``seed`` for i < size, on the host in NumPy (what the kernel computes; for tests)."""
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + np.arange(size, dtype=np.uint64) * np.uint64(GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(MIX1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(MIX2)
        z ^= z >> np.uint64(31)
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)


@cuda.self_test
def _self_test(dtype):
    cp = cuda.cupy()
    x = np.linspace(-2, 2, 64).reshape(4, 16)
    seed, p = 12345, 0.3
    keep = hash_uniform(seed, x.size).reshape(x.shape) >= p
    return [("dropout", dropout_apply(cp.asarray(x, dtype=dtype), seed, p), np.where(keep, x / (1 - p), 0.0))]
