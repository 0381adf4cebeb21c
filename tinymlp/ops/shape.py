"""Shape and indexing primitives: they move elements around, so backward moves the gradient
back to where each element came from."""

from __future__ import annotations

import numpy as np

from ..autograd import Function
from ..backend import array_module


class Reshape(Function):
    """out = x viewed with a new shape;  dL/dx = g reshaped to x's shape."""

    @staticmethod
    def forward(ctx, x, shape):
        ctx.shape = x.shape
        return x.reshape(shape)

    @staticmethod
    def backward(ctx, g):
        return g.reshape(ctx.shape)


class Transpose(Function):
    """out = x with axes permuted by ``axes`` (None: reversed);
    dL/dx = g permuted by the inverse permutation."""

    @staticmethod
    def forward(ctx, x, axes=None):
        axes = tuple(range(x.ndim))[::-1] if axes is None else tuple(a % x.ndim for a in axes)
        ctx.inverse = tuple(np.argsort(axes))
        return x.transpose(axes)

    @staticmethod
    def backward(ctx, g):
        return g.transpose(ctx.inverse)


def _has_array_index(index):
    parts = index if isinstance(index, tuple) else (index,)
    return any(hasattr(p, "shape") or isinstance(p, list) for p in parts)


class GetItem(Function):
    """out = x[index] (slices, integers, integer or boolean arrays);
    dL/dx = zeros with g added at the selected positions.

    With integer arrays one element may be selected twice, so its gradient is the *sum* of
    both uses: that needs the unbuffered ``add.at``; plain slices can simply assign.
    """

    @staticmethod
    def forward(ctx, x, index):
        ctx.shape, ctx.index = x.shape, index
        return x[index]

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        grad = xp.zeros(ctx.shape, dtype=g.dtype)
        if _has_array_index(ctx.index):
            if xp is np:
                np.add.at(grad, ctx.index, g)
            else:
                import cupyx  # noqa: PLC0415 - only reached with CuPy arrays

                cupyx.scatter_add(grad, ctx.index, g)
        else:
            grad[ctx.index] = g
        return grad, None


class Concatenate(Function):
    """out = the inputs joined along ``axis``;  dL/d(input k) = the k-th slice of g."""

    @staticmethod
    def forward(ctx, *arrays, axis=0):
        xp = array_module(arrays[0])
        ctx.axis = axis
        ctx.bounds = np.cumsum([a.shape[axis] for a in arrays])[:-1]
        return xp.concatenate(arrays, axis=axis)

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        return tuple(xp.split(g, ctx.bounds, axis=ctx.axis))
