"""The SGU's Toeplitz spatial weights, fast: their backward as one ``bincount`` on the CPU.

A Toeplitz weight (ops/gating.py) is built from one value per token offset; dL/d(values) sums
dL/dW along its diagonals. The reference scatters with ``add.at``; on the CPU ``bincount`` with
weights does the same sums in one pass, in float64. CUDA runs the reference (``add.at``: no
host synchronisation).
"""

from __future__ import annotations

import numpy as np

from ..ops.gating import Toeplitz1d, Toeplitz2d

__all__ = ["FastToeplitz1d", "FastToeplitz2d"]


class _FastToeplitzBackward:
    """The diagonal sums of dL/dW as ``bincount`` with weights on the CPU (one pass)."""

    @classmethod
    def backward(cls, ctx, g):
        k = int(np.prod(ctx.shape))
        dw = np.bincount(ctx.idx.ravel(), weights=g.ravel(), minlength=k)  # float64 sums
        return dw.astype(g.dtype, copy=False).reshape(ctx.shape)


class FastToeplitz1d(_FastToeplitzBackward, Toeplitz1d):
    pass


class FastToeplitz2d(_FastToeplitzBackward, Toeplitz2d):
    pass
