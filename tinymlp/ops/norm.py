"""Layer normalisation over the last axis.

The two formula functions, ``normalize`` and ``normalize_backward``, are also the LayerNorm
inside the spatial gating unit (gating.py).

Fast tier: ``tinymlp/fast/norm.py`` (no input-sized temporaries, column sums as products
with a ones vector, buffers reused on the last backward; one kernel per row on CUDA).
"""

from __future__ import annotations

import math

from ..autograd import Function
from ..backend import array_module, require_float

__all__ = ["LayerNorm", "layer_norm", "normalize", "normalize_backward"]


def normalize(x, eps):
    r"""x_hat = (x - mu) * rstd over the last axis (width D): returns ``(x_hat, rstd)``.

    Per row:  mu = (1/D) sum_j x_j,  var = (1/D) sum_j (x_j - mu)^2,  rstd = 1/sqrt(var + eps).
    rstd keeps a trailing axis of size 1, so it broadcasts against the rows.

    Written for floating point: squaring x_j - mu overflows once it passes sqrt(largest float)
    (1.8e19 in float32), and then var = inf, rstd = 0 and x_hat = 0, silently. So the centred
    values c are divided by the row's largest |c_j| = s before they are squared, and
    sqrt(var + eps) is hypot(std, sqrt(eps)), which never squares std:

        std = s sqrt( mean((c / s)^2) ),    rstd = 1 / hypot(std, sqrt(eps)).

    (The mean itself overflows only when the row's sum passes the largest float, 3.4e38.)
    """
    xp = array_module(x)
    mu = x.mean(axis=-1, keepdims=True)
    c = x - mu                                               # centred
    s = xp.abs(c).max(axis=-1, keepdims=True)                # the row's scale
    s = xp.where(s > 0, s, 1)                                # a constant row: c = 0 already
    std = s * xp.sqrt(((c / s) ** 2).mean(axis=-1, keepdims=True))
    rstd = 1 / xp.hypot(std, math.sqrt(eps))
    return c * rstd, rstd


def normalize_backward(dx_hat, x_hat, rstd):
    r"""dL/dx from dL/dx_hat (``g`` below), for x_hat = (x - mu) rstd of one row of width D.

    Differentiate x_hat_i = (x_i - mu) r, with r = rstd:
        dx_hat_i/dx_j = r (delta_ij - 1/D) + (x_i - mu) dr/dx_j,
        dr/dx_j = -(r^3 / 2) dvar/dx_j = -(r^3 / D) (x_j - mu) = -(r^2 / D) x_hat_j,
    since dvar/dx_j = (2/D) (x_j - mu) - (2/D^2) sum_i (x_i - mu), and the last sum is zero. So
        dx_hat_i/dx_j = r (delta_ij - 1/D - x_hat_i x_hat_j / D), and

        dL/dx_j = sum_i g_i dx_hat_i/dx_j = r ( g_j - mean(g) - x_hat_j mean(g * x_hat) ).

    Only x_hat and r are needed, not x, mu or var.
    """
    mean_g = dx_hat.mean(axis=-1, keepdims=True)
    mean_gx = (dx_hat * x_hat).mean(axis=-1, keepdims=True)
    return rstd * (dx_hat - mean_g - x_hat * mean_gx)


class LayerNorm(Function):
    r"""y = gamma * x_hat + beta over the last axis (width D) of x; gamma, beta of shape (D,).

    x_hat and rstd come from ``normalize``. Backward, with G = dL/dy:

        dL/dbeta  = sum over rows of G
        dL/dgamma = sum over rows of G * x_hat
        dL/dx     = normalize_backward(G * gamma, x_hat, rstd)     (the derivation is there)

    ``weight`` (gamma) or ``bias`` (beta) may be None. Forward saves x_hat, rstd and gamma.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, eps=1e-5):
        check_inputs(x, weight, bias, eps)
        x_hat, rstd = normalize(x, eps)
        y = x_hat if weight is None else x_hat * weight
        if bias is not None:
            y = y + bias
        ctx.save_for_backward(x_hat, rstd, weight)
        return y

    @staticmethod
    def backward(ctx, grad):
        x_hat, rstd, weight = ctx.saved_tensors
        rows = tuple(range(grad.ndim - 1))              # every axis but the last
        dweight = (grad * x_hat).sum(axis=rows)
        dbias = grad.sum(axis=rows)
        dx_hat = grad if weight is None else grad * weight
        return normalize_backward(dx_hat, x_hat, rstd), dweight, dbias


def check_inputs(x, weight, bias, eps):
    """What LayerNorm refuses (its fast implementations check the same): no axis, eps <= 0, a
    weight or bias that does not fit the last axis or the dtype."""
    if x.ndim == 0:
        raise ValueError("layer_norm: the input must have at least one axis (it normalises the last one)")
    if not eps > 0:
        raise ValueError(f"layer_norm: eps must be > 0 (it keeps 1/sqrt(var + eps) finite), got {eps!r}")
    d = x.shape[-1]
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != (d,):
            raise ValueError(
                f"layer_norm: {name} of shape {tuple(p.shape)} does not match the last axis of the input "
                f"of shape {tuple(x.shape)}; expected ({d},)"
            )
        if p is not None and p.dtype != x.dtype:
            raise TypeError(f"layer_norm: {name} is {p.dtype} but the input is {x.dtype}; convert with .astype()")


def layer_norm(x, weight, bias, eps=1e-5):
    """Normalise ``x`` over its last axis to zero mean and unit variance, then scale by
    ``weight`` and shift by ``bias`` (each of shape (D,), or None)."""
    return LayerNorm.apply(require_float("layer_norm", x), weight, bias, eps=eps)
