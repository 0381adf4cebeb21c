"""Patchify and indexing, fast: the tokens of a batch laid out token-major in memory, and
gradients of a slice laid out like the sliced array.

The result is the reference's (B, S, K) array, but its memory is ordered (S, B, K): it is the
transpose of a contiguous (S, B, K) array. Every op after it keeps that order (see
``tinymlp.fast``), so the token mixing of MLP-Mixer and gMLP (a product over S for every
(b, c)) reads an (S, B*C) matrix and runs as ONE matrix product for the whole batch, where the
usual (B, S, C) order would need a transposed copy or B small products.
"""

from __future__ import annotations

from ..backend import array_module
from ..ops.shape import GetItem, Patchify, scatter
from .layout import inverse, memory_order, token_major_view

__all__ = ["FastGetItem", "FastPatchify"]


class FastPatchify(Patchify):
    """``Patchify`` writing its (B, S, K) result token-major: (S, B, K) in memory."""

    @staticmethod
    def forward(ctx, images, patch_size):
        xp = array_module(images)
        B, C, H, W = images.shape
        ph, pw = patch_size
        gh, gw = H // ph, W // pw
        out = xp.empty((gh * gw, B, C * ph * pw), dtype=images.dtype)           # (S, B, K) in memory
        src = images.reshape(B, C, gh, ph, gw, pw).transpose(2, 4, 0, 1, 3, 5)  # (g_h, g_w, B, C, P_h, P_w)
        out.reshape(gh, gw, B, C, ph, pw)[...] = src
        ctx.patch_size = patch_size
        return token_major_view(out)                                             # seen as (B, S, K)


class FastGetItem(GetItem):
    """``GetItem`` whose gradient is laid out like x: the q, k, v slices of a token-major
    (B, S, 3d) projection send back a token-major gradient, which the Linear before them reads
    without a transposed copy (the reference allocates it in C order)."""

    @staticmethod
    def forward(ctx, x, index):
        ctx.shape, ctx.index, ctx.order = x.shape, index, memory_order(x)
        return x[index]

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        order = ctx.order
        grad = xp.zeros(tuple(ctx.shape[i] for i in order), dtype=g.dtype).transpose(inverse(order))
        return scatter(grad, ctx.index, g), None
