"""Reductions over axes. Backward spreads the gradient back over the reduced axes.

``axis`` may be None (all axes), an int or a tuple; ``keepdims`` as in NumPy.
"""

from __future__ import annotations

from ..autograd import Function
from ..backend import array_module, check_axes


def _axes(axis, shape, op):
    """``axis`` (None, an int or a tuple) as a tuple of non-negative axes; AxisError, as NumPy
    raises it, for an axis the tensor lacks or one named twice (no silent wrap-around)."""
    if axis is None:
        return tuple(range(len(shape)))
    return check_axes(op, axis, shape)


def _expand(g, shape, axes, keepdims):
    """Re-insert the reduced axes of ``g`` (if dropped) and broadcast it to ``shape``."""
    xp = array_module(g)
    if not keepdims:
        g = xp.expand_dims(g, axes)
    return xp.broadcast_to(g, shape)


class Sum(Function):
    """out = sum of x over ``axis``;  dL/dx[i] = g[i with the summed axes dropped]:
    every summed element receives the same gradient."""

    @staticmethod
    def forward(ctx, x, axis=None, keepdims=False):
        ctx.shape, ctx.axes, ctx.keepdims = x.shape, _axes(axis, x.shape, "sum"), keepdims
        return x.sum(axis=ctx.axes, keepdims=keepdims)

    @staticmethod
    def backward(ctx, g):
        return _expand(g, ctx.shape, ctx.axes, ctx.keepdims)


class Mean(Function):
    """out = sum of x over ``axis`` / N, N the number of elements reduced;  dL/dx = g / N."""

    @staticmethod
    def forward(ctx, x, axis=None, keepdims=False):
        ctx.shape, ctx.axes, ctx.keepdims = x.shape, _axes(axis, x.shape, "mean"), keepdims
        ctx.count = 1
        for a in ctx.axes:
            ctx.count *= x.shape[a]
        return x.mean(axis=ctx.axes, keepdims=keepdims)

    @staticmethod
    def backward(ctx, g):
        return _expand(g / ctx.count, ctx.shape, ctx.axes, ctx.keepdims)


class Max(Function):
    """out = max of x over ``axis``;  dL/dx = g at the maximal elements, 0 elsewhere.

    Ties share the gradient equally (the subgradient that keeps the sum right), so a
    gradient check at a tie agrees with neither one-sided difference: draw inputs without ties.
    """

    @staticmethod
    def forward(ctx, x, axis=None, keepdims=False):
        axes = _axes(axis, x.shape, "max")
        out = x.max(axis=axes, keepdims=True)
        share = (x == out).astype(x.dtype)  # 1 at the maxima, in x's dtype (no float64 detour)
        share /= share.sum(axis=axes, keepdims=True)
        ctx.save_for_backward(share)
        ctx.axes, ctx.keepdims = axes, keepdims
        return out if keepdims else out.squeeze(axis=axes)

    @staticmethod
    def backward(ctx, g):
        (share,) = ctx.saved_tensors
        return _expand(g, share.shape, ctx.axes, ctx.keepdims) * share
