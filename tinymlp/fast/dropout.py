"""Dropout, fast: on a GPU the mask is drawn inside the kernel that applies it and never stored.

The reference (ops/dropout.py) draws U[0, 1) numbers with the layer's NumPy generator, builds the
mask, saves it for backward and multiplies: on a GPU that is an upload of x.size numbers, a
comparison, a scaling and a product each way, and the mask held in memory until backward. Here
the generator gives one 63-bit seed per call (a host operation, nothing to wait for), one kernel
draws and applies the mask (``fast/kernels/dropout_cuda.py``), and backward calls it again with
the same seed on the gradient. The masks differ from the CPU's (another generator), and are the
same for the same seeds: a resumed run draws what the uninterrupted one would have.
"""

from __future__ import annotations

import numpy as np

from ..backend import array_module
from ..ops import dropout as reference
from ..ops.dropout import Dropout
from . import cuda, scalars
from .kernels import dropout_cuda

__all__ = ["CudaDropout"]


class CudaDropout(Dropout):
    """``Dropout`` on CUDA: a seed from the NumPy generator, the mask drawn in the kernel."""

    @staticmethod
    def forward(ctx, x, p, rng=None):
        if (rng is not None and not isinstance(rng, np.random.Generator)) or not cuda.applies(x):
            ctx.seed = None                               # a CuPy generator: the reference's draw
            return Dropout.forward(ctx, x, p, rng)
        generator = reference.DEFAULT_RNG if rng is None else rng
        if cuda.capturing():                              # a slot the replays fill: nothing drawn now
            ctx.seed = scalars.current().seed(array_module(x), generator)
        else:
            ctx.seed = int(generator.integers(2**63))
        ctx.p = p
        return dropout_cuda.dropout_apply(x, ctx.seed, p)

    @staticmethod
    def backward(ctx, g):
        if ctx.seed is None:
            return Dropout.backward(ctx, g)
        return dropout_cuda.dropout_apply(g, ctx.seed, ctx.p)

