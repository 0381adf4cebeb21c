"""Softmax cross-entropy, fast: on a GPU, with class ids, one kernel per row each way.

The reference (ops/loss.py) is a dozen array operations forward (max, shift, exponentials, sums,
the log, the picked logits, the smoothing term) and four backward; each is a launch on a GPU.
``CudaCrossEntropy`` does the forward in one kernel per row plus the mean of the rows, and the
backward in one kernel that reads the upstream gradient on the device
(``kernels/loss_cuda.py``). Soft targets (mixup, cutmix) take the reference.
"""

from __future__ import annotations

import numpy as np

from ..backend import array_module
from ..ops.loss import CrossEntropy
from . import cuda
from .kernels import loss_cuda

__all__ = ["CudaCrossEntropy", "device_name"]


class CudaCrossEntropy(CrossEntropy):
    """``CrossEntropy`` on CUDA for integer class ids: one kernel forward (and a sum), one backward.

    The kernels read the class ids as a contiguous int64 vector: ids of another integer dtype or
    a strided view (``labels[:, 0]``, ``y[::2]``) are made so on the device first (one copy);
    ids on the host beside logits on the GPU are refused, as a CPU tensor meeting a CUDA tensor
    is everywhere."""

    @staticmethod
    def forward(ctx, logits, target, label_smoothing=0.0):
        hard = target.ndim == 1 and target.dtype.kind in "iu"
        if hard and array_module(target) is not array_module(logits):
            raise RuntimeError(f"cross_entropy: the class ids are on the {device_name(target)} and the logits on "
                               f"the {device_name(logits)}; move the class ids to the logits' device first "
                               "(y.to(logits.device))")
        fused = hard and logits.flags.c_contiguous and not ctx.needs_input_grad[1] and cuda.applies(logits)
        ctx.fused = fused
        if not fused:
            return CrossEntropy.forward(ctx, logits, target, label_smoothing)
        target = target.astype(np.int64, order="C", copy=False)    # the kernel's long long*, unit stride
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


def device_name(x):
    return "cpu" if array_module(x) is np else "cuda"
