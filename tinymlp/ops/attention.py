"""Softmax, log-softmax and scaled dot-product attention, each with one fused backward.

Stability: softmax is invariant to adding a constant to a row, so every row has its maximum
subtracted before ``exp``: the largest exponent is then exp(0) = 1 and nothing overflows, even
for logits of 1e4.

Fast tier: ``tinymlp/fast/attention.py`` (in-place steps; the row softmax and its backward as
one compiled pass per row on the CPU with numba, one kernel per row on CUDA).
"""

from __future__ import annotations

import math

import numpy as np  # shape arithmetic only

from ..autograd import Function, unbroadcast
from ..backend import array_module, require_float
from ..tensor import Tensor

__all__ = ["Attention", "LogSoftmax", "SelfAttention", "Softmax", "attention", "log_softmax", "self_attention",
           "softmax"]


class Softmax(Function):
    r"""p = softmax(x) along ``axis``:  p_i = exp(x_i - max x) / sum_k exp(x_k - max x).

    Backward: dp_i/dx_j = p_i (delta_ij - p_j), so with g = dL/dp

        dL/dx_j = sum_i g_i p_i (delta_ij - p_j) = p_j (g_j - sum_i g_i p_i),

    one dot product per row, broadcast back. Forward saves p (its output) and nothing else.
    """

    @staticmethod
    def forward(ctx, x, axis=-1):
        e = array_module(x).exp(x - x.max(axis=axis, keepdims=True))
        p = e / e.sum(axis=axis, keepdims=True)
        ctx.save_for_backward(p)
        ctx.axis = axis
        return p

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        return p * (grad - (grad * p).sum(axis=ctx.axis, keepdims=True))


class LogSoftmax(Function):
    r"""y = log softmax(x) along ``axis``:  y_i = (x_i - m) - log sum_k exp(x_k - m),  m = max x.

    Backward: dy_i/dx_j = delta_ij - p_j with p = softmax(x) = exp(y), so with g = dL/dy

        dL/dx_j = sum_i g_i (delta_ij - p_j) = g_j - p_j sum_i g_i.

    Forward saves p = exp(y), which it has in hand (no exp in backward).
    """

    @staticmethod
    def forward(ctx, x, axis=-1):
        xp = array_module(x)
        shifted = x - x.max(axis=axis, keepdims=True)
        e = xp.exp(shifted)
        total = e.sum(axis=axis, keepdims=True)
        ctx.save_for_backward(e / total)
        ctx.axis = axis
        return shifted - xp.log(total)

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        return grad - p * grad.sum(axis=ctx.axis, keepdims=True)


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

    The 1/sqrt(d) of S enters dq and dk once each, by the chain rule through S = q k^T / sqrt(d).
    Masked entries have P = 0, so dL/dS is 0 there without any masking in backward.

    Masking uses a large *finite* negative (-finfo(dtype).max / 2: finite even after the row
    maximum is subtracted), never -inf, so no inf - inf = NaN appears. A row whose keys are all
    masked has only equal logits: its P is uniform over those keys and its output is the mean of
    v. That row does not depend on q or k, and backward gives it dL/dS = 0 (its gradient still
    flows to v). ``causal=True`` allows key j for query i iff j <= i (queries and keys aligned
    at the start); it combines with ``mask`` by logical and. Forward saves q, k, v and P.
    """

    @staticmethod
    def forward(ctx, q, k, v, mask=None, causal=False):
        check_shapes(q, k, v, mask)
        xp = array_module(q)
        n, d, m = q.shape[-2], q.shape[-1], k.shape[-2]
        allowed = mask
        if causal:
            lower = xp.tri(n, m, dtype=bool)              # lower[i, j] = j <= i
            allowed = lower if allowed is None else allowed & lower
        S = q @ k.swapaxes(-1, -2) / math.sqrt(d)
        if allowed is not None:
            S = xp.where(allowed, S, xp.finfo(S.dtype).min / 2)
        E = xp.exp(S - S.max(axis=-1, keepdims=True))
        P = E / E.sum(axis=-1, keepdims=True)
        ctx.save_for_backward(q, k, v, P)
        ctx.empty_rows = None if allowed is None else ~allowed.any(axis=-1, keepdims=True)
        return P @ v

    @staticmethod
    def backward(ctx, grad):
        q, k, v, P = ctx.saved_tensors
        xp = array_module(grad)
        scale = 1 / math.sqrt(q.shape[-1])
        dv = P.swapaxes(-1, -2) @ grad                    # P^T G
        dP = grad @ v.swapaxes(-1, -2)                    # G v^T
        dS = P * (dP - (dP * P).sum(axis=-1, keepdims=True))
        if ctx.empty_rows is not None:                    # fully masked rows do not depend on q, k
            dS = xp.where(ctx.empty_rows, 0, dS)
        dq = dS @ k * scale
        dk = dS.swapaxes(-1, -2) @ q * scale
        return unbroadcast(dq, q.shape), unbroadcast(dk, k.shape), unbroadcast(dv, v.shape)


class SelfAttention(Function):
    r"""Attention on a packed input: q, k, v are the three thirds of the last axis of ``qkv``.

        [q | k | v] = qkv  (..., n, 3d),     O = Attention(q, k, v)   (..., n, d)

    The projection that makes q, k and v is one Linear (one matrix product), and this op takes
    its output whole. Backward is ``Attention``'s, with the three gradients side by side in
    the layout of qkv: dL/dqkv = [dL/dq | dL/dk | dL/dv] (splitting and concatenating are each
    other's adjoint). One op instead of three slices and an attention: no zero-filled
    gradient per slice, no sum of three.
    """

    @staticmethod
    def forward(ctx, qkv, mask=None, causal=False):
        check_packed(qkv)
        q, k, v = array_module(qkv).split(qkv, 3, axis=-1)
        return Attention.forward(ctx, q, k, v, mask=mask, causal=causal)

    @staticmethod
    def backward(ctx, grad):
        dq, dk, dv = Attention.backward(ctx, grad)
        return array_module(grad).concatenate([dq, dk, dv], axis=-1)


def check_packed(qkv):
    """qkv must be [q | k | v] along its last axis (a width divisible by 3)."""
    if qkv.ndim < 2 or qkv.shape[-1] % 3:
        raise ValueError(f"self_attention: qkv must be (..., tokens, 3 d), [q | k | v] along the last axis; "
                         f"got shape {tuple(qkv.shape)}")


def check_shapes(q, k, v, mask):
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
    return Softmax.apply(require_float("softmax", x), axis=axis)


def log_softmax(x, axis=-1):
    """log(softmax(x)) along ``axis``, computed without forming softmax's small numbers."""
    return LogSoftmax.apply(require_float("log_softmax", x), axis=axis)


def self_attention(qkv, mask=None, causal=False):
    """``attention(q, k, v)`` with q, k, v the three thirds of ``qkv``'s last axis (see
    ``SelfAttention``): the output of one projection to 3 d, taken whole."""
    if mask is not None:
        like = qkv.data if isinstance(qkv, Tensor) else qkv
        mask = array_module(like).asarray(mask.data if isinstance(mask, Tensor) else mask)
    return SelfAttention.apply(require_float("self_attention", qkv), mask=mask, causal=bool(causal))


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
