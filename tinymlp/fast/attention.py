"""Softmax and attention, fast: in-place steps, the output laid out like q; the softmax over the
rows compiled on the CPU (numba) and one kernel per row on CUDA.

Attention also skips the "any fully masked row?" bookkeeping on the CPU when the answer is no
(reading that answer back would stall a GPU, so there the row mask is always applied). On the
CPU its output is written in q's memory order: aMLP's q, k and v are thirds of a token-major
projection, so the output is token-major too and the projection after it reads it, and sends
its gradient back, without a transposed copy.

The fast classes (``FastSoftmax``, ``FastAttention``, ``FastSelfAttention``) are array code for
NumPy and CuPy alike. Their subclasses differ in the softmax steps only: the forward along the
rows (``softmax_rows``: scale, mask, subtract the maximum, exp, normalise) and its backward,
dL/dS = P * (dL/dP - rowsum(dL/dP * P)) (``softmax_rows_backward``). ``CompiledAttention`` (CPU,
numba installed) runs both as one compiled pass per row, with a float32 exp that vectorises
(``kernels/attention_numba.py``); ``CudaAttention`` runs each (the forward where there is no
mask) as one kernel per row (``kernels/attention_cuda.py``), and its products through cuBLAS
calls a CUDA graph can capture (``product``: ``cublas.product``).
"""

from __future__ import annotations

import math

import numpy as np

from ..autograd import unbroadcast
from ..backend import array_module
from ..ops.attention import Attention, SelfAttention, Softmax, check_packed, check_shapes
from . import compiled, cublas, cuda
from .kernels import attention_cuda, attention_numba
from .layout import inverse, memory_order

__all__ = ["CompiledAttention", "CompiledSelfAttention", "CompiledSoftmax", "CudaAttention", "CudaSelfAttention",
           "CudaSoftmax", "FastAttention", "FastSelfAttention", "FastSoftmax"]


class FastSoftmax(Softmax):
    """``Softmax`` in place; along the last axis through the back end's row kernels, if any
    (``last_axis`` and ``last_axis_backward``: None where there is no kernel for the arrays)."""

    @staticmethod
    def last_axis(x):
        """softmax(x) along the last axis in a new array, or None (no kernel)."""
        return None

    @staticmethod
    def last_axis_backward(p, grad):
        """p * (grad - rowsum(grad * p)) along the last axis in a new array, or None (no kernel)."""
        return None

    @classmethod
    def forward(cls, ctx, x, axis=-1):
        p = cls.last_axis(x) if axis in (-1, x.ndim - 1) else None
        if p is None:
            p = x - x.max(axis=axis, keepdims=True)
            array_module(x).exp(p, out=p)
            p /= p.sum(axis=axis, keepdims=True)
        ctx.save_for_backward(p)
        ctx.axis = axis
        return p

    @classmethod
    def backward(cls, ctx, grad):
        (p,) = ctx.saved_tensors
        dx = cls.last_axis_backward(p, grad) if ctx.axis in (-1, p.ndim - 1) else None
        if dx is None:
            dx = grad - (grad * p).sum(axis=ctx.axis, keepdims=True)
            dx *= p
        return dx


class CudaSoftmax(FastSoftmax):
    """``Softmax`` on CUDA: along the last axis one kernel per row each way."""

    @staticmethod
    def last_axis(x):
        if not cuda.applies(x):
            return None
        return attention_cuda.softmax_forward(array_module(x).array(x, order="C", copy=True))

    @staticmethod
    def last_axis_backward(p, grad):
        return attention_cuda.softmax_backward(p, grad) if cuda.applies(p, grad) else None


class CompiledSoftmax(FastSoftmax):
    """``Softmax`` along the last axis as one compiled pass per row each way (numba)."""

    @staticmethod
    def last_axis(x):
        if not compiled.applies(x):
            return None
        p = np.array(x, order="C")
        return p if attention_numba.softmax_rows(p) else None

    @staticmethod
    def last_axis_backward(p, grad):
        if grad.dtype != p.dtype:
            return None
        dx = np.array(grad, order="C")
        return dx if attention_numba.softmax_rows_backward(p, dx) else None


class FastAttention(Attention):
    """``Attention`` with in-place steps (see the module docstring); its products through
    ``product`` (NumPy's ``matmul``)."""

    product = staticmethod(np.matmul)

    @staticmethod
    def softmax_rows(s, scale, allowed):
        """P = softmax(scale * S) along the rows, S := -big where not ``allowed``; S's memory is P's."""
        xp = array_module(s)
        s *= scale
        if allowed is not None:
            s = xp.where(allowed, s, xp.finfo(s.dtype).min / 2)
        s -= s.max(axis=-1, keepdims=True)
        p = xp.exp(s, out=s)
        p /= p.sum(axis=-1, keepdims=True)
        return p

    @staticmethod
    def softmax_rows_backward(p, ds, scale):
        """dL/dS = P * (dL/dP - rowsum(dL/dP * P)), times ``scale``, written into ``ds`` (dL/dP)."""
        ds -= array_module(ds).einsum("...nm,...nm->...n", ds, p)[..., None]
        ds *= p
        ds *= scale
        return ds

    @classmethod
    def forward(cls, ctx, q, k, v, mask=None, causal=False):
        xp = array_module(q)
        check_shapes(q, k, v, mask)
        n, d, m = q.shape[-2], q.shape[-1], k.shape[-2]
        s = cls.product(q, k.swapaxes(-1, -2))
        allowed = mask
        if causal:
            lower = xp.tri(n, m, dtype=bool)
            allowed = lower if allowed is None else allowed & lower
        empty_rows = None
        if allowed is not None:
            empty_rows = ~allowed.any(axis=-1, keepdims=True)
            if xp is np and not empty_rows.any():
                empty_rows = None
        p = cls.softmax_rows(s, 1.0 / math.sqrt(d), allowed)
        ctx.save_for_backward(q, k, v, p)
        ctx.empty_rows = empty_rows
        if xp is not np:
            return cls.product(p, v)
        shape = np.broadcast_shapes(p.shape[:-2], v.shape[:-2]) + (n, v.shape[-1])   # v may add batch axes
        return np.matmul(p, v, out=_laid_out_like(q, shape, p.dtype))

    @classmethod
    def backward(cls, ctx, grad):
        return _attention_backward(ctx, grad, *ctx.needs_input_grad[:3],
                                   softmax_rows_backward=cls.softmax_rows_backward, product=cls.product)


def _laid_out_like(q, shape, dtype):
    """A new array of ``shape`` in q's memory order (the last axis last), or in C order where
    the shapes differ (broadcast batch axes) or q's rows are not contiguous."""
    order = memory_order(q)
    if q.shape[:-1] != shape[:-1] or order[-1] != q.ndim - 1:
        return np.empty(shape, dtype=dtype)
    return np.empty(tuple(shape[i] for i in order), dtype=dtype).transpose(inverse(order))


def _attention_backward(ctx, grad, need_q, need_k, need_v, softmax_rows_backward, product, out=None):
    """(dq, dk, dv); with ``out`` (three arrays of q's, k's and v's shapes) the products are
    written there (the packed op's thirds of one gradient)."""
    q, k, v, p = ctx.saved_tensors
    xp = array_module(grad)
    scale = 1.0 / math.sqrt(q.shape[-1])

    def into(a, b, shape, i):
        return product(a, b, out=out[i]) if out is not None else unbroadcast(product(a, b), shape)

    dv = into(p.swapaxes(-1, -2), grad, v.shape, 2) if need_v else None
    dq = dk = None
    if need_q or need_k:
        ds = product(grad, v.swapaxes(-1, -2))          # dL/dP
        ds = softmax_rows_backward(p, ds, scale)        # dL/dS, times the scale of S
        if ctx.empty_rows is not None:
            ds = xp.where(ctx.empty_rows, 0, ds)
        dq = into(ds, k, q.shape, 0) if need_q else None
        dk = into(ds.swapaxes(-1, -2), q, k.shape, 1) if need_k else None
    return dq, dk, dv


class CompiledAttention(FastAttention):
    """``Attention`` with the softmax steps compiled (numba), where the kernels take the arrays."""

    @staticmethod
    def softmax_rows(s, scale, allowed):
        if allowed is not None and compiled.applies(s):
            s *= scale
            s = np.where(allowed, s, np.finfo(s.dtype).min / 2)
            scale = 1.0
        if attention_numba.softmax_rows(s, scale):
            return s
        return FastAttention.softmax_rows(s, scale, allowed)

    @staticmethod
    def softmax_rows_backward(p, ds, scale):
        if attention_numba.softmax_rows_backward(p, ds, scale):
            return ds
        return FastAttention.softmax_rows_backward(p, ds, scale)


class CudaAttention(FastAttention):
    """``Attention`` on CUDA: the softmax (with its scale, without a mask) and its backward one
    kernel per row, the products through cuBLAS calls a graph can capture."""

    product = staticmethod(cublas.product)

    @staticmethod
    def softmax_rows(s, scale, allowed):
        if allowed is None and s.flags.c_contiguous and cuda.applies(s):
            return attention_cuda.softmax_forward(s, scale)
        return FastAttention.softmax_rows(s, scale, allowed)

    @staticmethod
    def softmax_rows_backward(p, ds, scale):
        if ds.shape == p.shape and cuda.applies(p, ds):
            ds = attention_cuda.softmax_backward(p, ds, out=ds)
            ds *= scale
            return ds
        return FastAttention.softmax_rows_backward(p, ds, scale)


class FastSelfAttention(SelfAttention):
    """``SelfAttention`` through ``FastAttention`` on views of qkv; dL/dqkv is written into one
    array laid out like qkv (token-major qkv: the projection's backward reads it without a copy)."""

    attention = FastAttention       # the attention over views of qkv, of the same back end

    @classmethod
    def forward(cls, ctx, qkv, mask=None, causal=False):
        check_packed(qkv)
        d = qkv.shape[-1] // 3
        ctx.order = memory_order(qkv)
        return cls.attention.forward(ctx, qkv[..., :d], qkv[..., d:2 * d], qkv[..., 2 * d:], mask=mask, causal=causal)

    @classmethod
    def backward(cls, ctx, grad):
        shape, order = ctx.input_shapes[0], ctx.order
        d = shape[-1] // 3
        out = array_module(grad).empty(tuple(shape[i] for i in order), dtype=grad.dtype).transpose(inverse(order))
        _attention_backward(ctx, grad, True, True, True, softmax_rows_backward=cls.attention.softmax_rows_backward,
                            product=cls.attention.product, out=(out[..., :d], out[..., d:2 * d], out[..., 2 * d:]))
        return out


class CompiledSelfAttention(FastSelfAttention):
    """``SelfAttention`` through ``CompiledAttention``."""

    attention = CompiledAttention


class CudaSelfAttention(FastSelfAttention):
    """``SelfAttention`` on CUDA: through ``CudaAttention``."""

    attention = CudaAttention
