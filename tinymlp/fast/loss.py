"""Softmax cross-entropy, fast: on a GPU, with class ids, one kernel per row each way.

The reference (ops/loss.py) is a dozen array operations forward (max, shift, exponentials, sums,
the log, the picked logits, the smoothing term) and four backward; each is a launch on a GPU.
``CudaCrossEntropy`` does the forward in one kernel per row plus the mean of the rows, and the
backward in one kernel that reads the upstream gradient on the device
(``kernels/loss_cuda.py``). Soft targets (mixup, cutmix) and other dtypes of class ids take the
reference.
"""

from __future__ import annotations

import numpy as np

from ..ops.loss import CrossEntropy
from . import cuda
from .kernels import loss_cuda

__all__ = ["CudaCrossEntropy"]


class CudaCrossEntropy(CrossEntropy):
    """``CrossEntropy`` on CUDA for int64 class ids: one kernel forward (and a sum), one backward."""

    @staticmethod
    def forward(ctx, logits, target, label_smoothing=0.0):
        fused = (target.ndim == 1 and target.dtype == np.int64 and logits.flags.c_contiguous
                 and not ctx.needs_input_grad[1] and cuda.applies(logits))
        ctx.fused = fused
        if not fused:
            return CrossEntropy.forward(ctx, logits, target, label_smoothing)
        p, rows = loss_cuda.cross_entropy_forward(logits, target, label_smoothing)
        ctx.alpha = label_smoothing
        ctx.save_for_backward(p, target)
        return rows.sum()

    @staticmethod
    def backward(ctx, g):
        if not ctx.fused:
            return CrossEntropy.backward(ctx, g)
        p, target = ctx.saved_tensors
        return loss_cuda.cross_entropy_backward(p, target, g, ctx.alpha), None
