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
        return scatter(array_module(g).zeros(ctx.shape, dtype=g.dtype), ctx.index, g), None


def scatter(grad, index, g):
    """grad with g added at ``index`` (grad starts at zero): ``add.at`` where an integer array may
    select an element twice (its gradients then add up), a plain assignment for slices."""
    if _has_array_index(index):
        array_module(g).add.at(grad, index, g)
    else:
        grad[index] = g
    return grad


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


class Patchify(Function):
    r"""Cut images (B, C, H, W) into P_h x P_w patches: (B, S, C P_h P_w), S = (H/P_h)(W/P_w).

    Patches in row-major order (token t = r * g_w + c), each flattened in (channel, i, j) order:

        out[b, r g_w + c, (ch, i, j)] = images[b, ch, r P_h + i, c P_w + j].

    A rearrangement (no arithmetic): every output element is one input element, so backward
    sends each gradient back to where its value came from, the inverse rearrangement.
    Fast tier: ``tinymlp/fast/shape.py`` (lays the tokens out token-major in memory).
    """

    @staticmethod
    def forward(ctx, images, patch_size):
        B, C, H, W = images.shape
        ph, pw = patch_size
        x = images.reshape(B, C, H // ph, ph, W // pw, pw)      # split H into (g_h, P_h), W into (g_w, P_w)
        x = x.transpose(0, 2, 4, 1, 3, 5)                       # (B, g_h, g_w, C, P_h, P_w)
        ctx.patch_size = patch_size
        return x.reshape(B, (H // ph) * (W // pw), C * ph * pw)

    @staticmethod
    def backward(ctx, grad):
        B, C, H, W = ctx.input_shapes[0]
        ph, pw = ctx.patch_size
        g = grad.reshape(B, H // ph, W // pw, C, ph, pw)
        g = g.transpose(0, 3, 1, 4, 2, 5)                       # (B, C, g_h, P_h, g_w, P_w)
        return g.reshape(B, C, H, W)


def patchify(images, patch_size):
    """Cut images (B, C, H, W) into P x P patches, (B, S, C*P*P), row-major (see ``Patchify``).

    ``patch_size`` is an int or a pair (P_h, P_w) dividing H and W.
    """
    ph, pw = (patch_size, patch_size) if isinstance(patch_size, int) else tuple(patch_size)
    if images.ndim != 4 or images.shape[2] % ph or images.shape[3] % pw:
        raise ValueError(f"patchify: expected images (B, C, H, W) with H divisible by {ph} and W by {pw}, "
                         f"got shape {tuple(images.shape)}")
    return Patchify.apply(images, patch_size=(int(ph), int(pw)))
