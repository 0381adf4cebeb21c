"""Softmax and attention, fast: in-place steps, and the softmax backward as one kernel per row
on CUDA (``cuda_kernels.softmax_backward``).

Attention also skips the "any fully masked row?" bookkeeping on the CPU when the answer is no
(reading that answer back would stall a GPU, so there the row mask is always applied).
"""

from __future__ import annotations

import math

import numpy as np

from ..autograd import unbroadcast
from ..backend import array_module
from ..ops.attention import Attention, SelfAttention, Softmax, _check_packed, _check_shapes
from . import cuda_kernels, register
from .layout import inverse, memory_order

__all__ = ["FastAttention", "FastSelfAttention", "FastSoftmax"]


@register(Softmax)
class FastSoftmax(Softmax):
    """``Softmax`` in place; its backward one kernel per row on CUDA."""

    @staticmethod
    def forward(ctx, x, axis=-1):
        xp = array_module(x)
        p = x - x.max(axis=axis, keepdims=True)
        xp.exp(p, out=p)
        p /= p.sum(axis=axis, keepdims=True)
        ctx.save_for_backward(p)
        ctx.axis = axis
        return p

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        if ctx.axis in (-1, p.ndim - 1) and cuda_kernels.applies(p, grad):
            return cuda_kernels.softmax_backward(p, grad)
        dx = grad - (grad * p).sum(axis=ctx.axis, keepdims=True)
        dx *= p
        return dx


@register(Attention)
class FastAttention(Attention):
    """``Attention`` with in-place steps (see the module docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, mask=None, causal=False):
        xp = array_module(q)
        _check_shapes(q, k, v, mask)
        n, d, m = q.shape[-2], q.shape[-1], k.shape[-2]
        scale = 1.0 / math.sqrt(d)
        s = q @ k.swapaxes(-1, -2)
        s *= scale
        allowed = mask
        if causal:
            lower = xp.tri(n, m, dtype=bool)
            allowed = lower if allowed is None else allowed & lower
        empty_rows = None
        if allowed is not None:
            s = xp.where(allowed, s, xp.finfo(s.dtype).min / 2)
            empty_rows = ~allowed.any(axis=-1, keepdims=True)
            if xp is np and not empty_rows.any():
                empty_rows = None
        s -= s.max(axis=-1, keepdims=True)
        p = xp.exp(s, out=s)
        p /= p.sum(axis=-1, keepdims=True)
        ctx.save_for_backward(q, k, v, p)
        ctx.empty_rows = empty_rows
        return p @ v

    @staticmethod
    def backward(ctx, grad):
        return _attention_backward(ctx, grad, *ctx.needs_input_grad[:3])


def _attention_backward(ctx, grad, need_q, need_k, need_v, out=None):
    """(dq, dk, dv); with ``out`` (three arrays of q's, k's and v's shapes) the products are
    written there (the packed op's thirds of one gradient)."""
    q, k, v, p = ctx.saved_tensors
    xp = array_module(grad)
    scale = 1.0 / math.sqrt(q.shape[-1])

    def product(a, b, shape, i):
        return xp.matmul(a, b, out=out[i]) if out is not None else unbroadcast(a @ b, shape)

    dv = product(p.swapaxes(-1, -2), grad, v.shape, 2) if need_v else None
    dq = dk = None
    if need_q or need_k:
        ds = grad @ v.swapaxes(-1, -2)   # dL/dP
        if ds.shape == p.shape and cuda_kernels.applies(p, ds):
            ds = cuda_kernels.softmax_backward(p, ds, out=ds)
        else:
            ds -= xp.einsum("...nm,...nm->...n", ds, p)[..., None]
            ds *= p                      # dL/dS
        if ctx.empty_rows is not None:
            ds = xp.where(ctx.empty_rows, 0, ds)
        ds *= scale
        dq = product(ds, k, q.shape, 0) if need_q else None
        dk = product(ds.swapaxes(-1, -2), q, k.shape, 1) if need_k else None
    return dq, dk, dv


@register(SelfAttention)
class FastSelfAttention(SelfAttention):
    """``SelfAttention`` through ``FastAttention`` on views of qkv; dL/dqkv is written into one
    array laid out like qkv (token-major qkv: the projection's backward reads it without a copy)."""

    @staticmethod
    def forward(ctx, qkv, mask=None, causal=False):
        _check_packed(qkv)
        d = qkv.shape[-1] // 3
        ctx.order = memory_order(qkv)
        return FastAttention.forward(ctx, qkv[..., :d], qkv[..., d:2 * d], qkv[..., 2 * d:], mask=mask, causal=causal)

    @staticmethod
    def backward(ctx, grad):
        shape, order = ctx.input_shapes[0], ctx.order
        d = shape[-1] // 3
        out = array_module(grad).empty(tuple(shape[i] for i in order), dtype=grad.dtype).transpose(inverse(order))
        _attention_backward(ctx, grad, True, True, True, out=(out[..., :d], out[..., d:2 * d], out[..., 2 * d:]))
        return out
