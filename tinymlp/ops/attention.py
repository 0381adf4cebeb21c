"""Softmax, log-softmax and scaled dot-product attention, each with one fused backward.

Stability: softmax is invariant to adding a constant to a row, so every row has its maximum
subtracted before ``exp``: the largest exponent is then exp(0) = 1 and nothing overflows, even
for logits of 1e4.
"""

from __future__ import annotations

import math

import numpy as np  # shape arithmetic, and the CPU-only shortcut for masks without empty rows

from ..autograd import Function, unbroadcast
from ..backend import array_module
from ..tensor import Tensor
from . import cuda_kernels


class Softmax(Function):
    r"""p = softmax(x) along ``axis``:  p_i = exp(x_i - max x) / sum_k exp(x_k - max x).

    Backward: dp_i/dx_j = p_i (delta_ij - p_j), so with g = dL/dp

        dL/dx_j = sum_i g_i p_i (delta_ij - p_j) = p_j (g_j - sum_i g_i p_i),

    one dot product per row, broadcast back. Forward saves p (its output) and nothing else.
    """

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
            return cuda_kernels.softmax_backward(p, grad)  # one kernel per row on CUDA
        dot = (grad * p).sum(axis=ctx.axis, keepdims=True)
        dx = grad - dot
        dx *= p
        return dx


class LogSoftmax(Function):
    r"""y = log softmax(x) along ``axis``:  y_i = (x_i - m) - log sum_k exp(x_k - m),  m = max x.

    Backward: dy_i/dx_j = delta_ij - p_j with p = softmax(x) = exp(y), so with g = dL/dy

        dL/dx_j = sum_i g_i (delta_ij - p_j) = g_j - p_j sum_i g_i.

    Forward has exp(x - m) in hand; it saves p = exp(x - m)/sum (no exp in backward).
    """

    @staticmethod
    def forward(ctx, x, axis=-1):
        xp = array_module(x)
        y = x - x.max(axis=axis, keepdims=True)
        e = xp.exp(y)
        total = e.sum(axis=axis, keepdims=True)
        y -= xp.log(total)
        if ctx.needs_input_grad[0]:
            e /= total
            ctx.save_for_backward(e)
        ctx.axis = axis
        return y

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        dx = p * grad.sum(axis=ctx.axis, keepdims=True)
        array_module(grad).subtract(grad, dx, out=dx)
        return dx


class Attention(Function):
    r"""Scaled dot-product attention, batched over leading axes (which broadcast).

    q (..., n, d), k (..., m, d), v (..., m, dv); allowed (..., n, m) from ``mask`` and ``causal``:

        S = q k^T / sqrt(d),   S_ij := -big where (i, j) is not allowed,
        P = softmax over j of S,   O = P v   (..., n, dv).

    Backward, with G = dL/dO (each step is the rule for a matrix product or for softmax):

        dL/dv = P^T G
        dL/dP = G v^T
        dL/dS = P * (dL/dP - delta),   delta_i = sum_j dL/dP_ij P_ij     (softmax, row by row)
        dL/dq = dL/dS k / sqrt(d),     dL/dk = (dL/dS)^T q / sqrt(d)

    Masked entries have P = 0, so dL/dS is 0 there without any masking in backward.
    (delta also equals sum_c G_ic O_ic, FlashAttention's cheaper form when m >> dv; at the
    sizes here m ~ dv, and the form above is exactly 0 where a row has a single allowed key.)

    Masking uses a large *finite* negative (-finfo(dtype).max / 2: finite even after the row
    maximum is subtracted), never -inf, so no inf - inf = NaN appears. A row whose keys are all
    masked has only equal logits: its P is uniform over those keys and its output is the mean of
    v. That row does not depend on q or k, and backward gives it dL/dS = 0 (its gradient still
    flows to v). ``causal=True`` allows key j for query i iff j <= i (queries and keys aligned
    at the start); it combines with ``mask`` by logical and.

    Forward saves q, k, v and P.
    """

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
            lower = xp.tri(n, m, dtype=bool)  # lower[i, j] = j <= i
            allowed = lower if allowed is None else allowed & lower
        empty_rows = None
        if allowed is not None:
            s = xp.where(allowed, s, xp.finfo(s.dtype).min / 2)
            empty_rows = ~allowed.any(axis=-1, keepdims=True)
            # asking "any empty row?" reads a value back: free on the CPU, a stall on a GPU, where
            # backward simply applies the (all-False) row mask instead
            if xp is np and not empty_rows.any():
                empty_rows = None
        s -= s.max(axis=-1, keepdims=True)
        p = xp.exp(s, out=s)
        p /= p.sum(axis=-1, keepdims=True)
        out = p @ v
        ctx.save_for_backward(q, k, v, p)
        ctx.scale, ctx.empty_rows = scale, empty_rows
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, p = ctx.saved_tensors
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        xp = array_module(grad)
        dv = unbroadcast(p.swapaxes(-1, -2) @ grad, v.shape) if need_v else None
        dq = dk = None
        if need_q or need_k:
            ds = grad @ v.swapaxes(-1, -2)  # dL/dP
            if ds.shape == p.shape and cuda_kernels.applies(p, ds):
                ds = cuda_kernels.softmax_backward(p, ds, out=ds)  # dL/dS, one kernel on CUDA
            else:
                ds -= xp.einsum("...nm,...nm->...n", ds, p)[..., None]
                ds *= p                      # dL/dS
            if ctx.empty_rows is not None:   # fully masked rows do not depend on q, k
                ds = xp.where(ctx.empty_rows, 0, ds)
            ds *= ctx.scale
            dq = unbroadcast(ds @ k, q.shape) if need_q else None
            dk = unbroadcast(ds.swapaxes(-1, -2) @ q, k.shape) if need_k else None
        return dq, dk, dv


def _check_shapes(q, k, v, mask):
    """Name the op and the shapes: attention mixes up easily."""
    shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if q.ndim < 2 or k.ndim < 2 or v.ndim < 2:
        raise ValueError(f"attention: q, k, v need at least 2 axes (..., tokens, features), got {shapes}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"attention: q and k must have the same feature width d, got {shapes}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"attention: k and v must have the same number of keys m, got {shapes}")
    try:
        lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except ValueError:
        raise ValueError(f"attention: the leading (batch/head) axes do not broadcast: {shapes}") from None
    if len({q.dtype, k.dtype, v.dtype}) > 1:
        raise TypeError(f"attention: q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if mask is not None:
        target = (*lead, q.shape[-2], k.shape[-2])
        if mask.dtype != bool:
            raise TypeError(f"attention: mask must be boolean (True = allowed), got {mask.dtype}")
        try:
            fits = np.broadcast_shapes(mask.shape, target) == target
        except ValueError:
            fits = False
        if not fits:  # a mask with extra axes would silently broadcast the output: refuse it
            raise ValueError(
                f"attention: mask of shape {tuple(mask.shape)} does not broadcast to the scores' shape "
                f"{target} (..., n, m); {shapes}"
            )


def softmax(x, axis=-1):
    """Softmax along ``axis`` (stable: each slice has its maximum subtracted first)."""
    return Softmax.apply(x, axis=axis)


def log_softmax(x, axis=-1):
    """log(softmax(x)) along ``axis``, computed without forming softmax's small numbers."""
    return LogSoftmax.apply(x, axis=axis)


def attention(q, k, v, mask=None, causal=False):
    """Scaled dot-product attention ``softmax(q k^T / sqrt(d)) v`` over the last two axes.

    ``mask``: boolean array or Tensor broadcastable to (..., n, m), True = key allowed.
    ``causal``: query i sees keys j <= i. Multi-head attention: put heads on a leading axis,
    e.g. (batch, heads, tokens, d_head).
    """
    if mask is not None:
        like = q.data if isinstance(q, Tensor) else q
        mask = array_module(like).asarray(mask.data if isinstance(mask, Tensor) else mask)
    return Attention.apply(q, k, v, mask=mask, causal=bool(causal))
