"""Softmax cross-entropy, fused with its log-softmax, for hard or soft targets.

For logits x (B, K) and a target distribution t_b over the K classes (one-hot for a class id,
any distribution for mixup / cutmix), with label smoothing alpha:

    t_eff = (1 - alpha) * t + alpha / K
    L     = -(1/B) * sum_b sum_k t_eff[b,k] * log p[b,k],     p = softmax(x)   (row-wise)

The log-softmax is computed stably: with m = max_k x[b,k] and s = x - m,
log p = s - log(sum_k exp(s)), so logits of 1e4 give exact, finite values.
"""

from __future__ import annotations

import numpy as np

from ..autograd import Function
from ..backend import array_module, is_float_dtype, require_float
from ..tensor import Tensor

__all__ = ["CrossEntropy", "cross_entropy"]


class CrossEntropy(Function):
    """L = -(1/B) sum_b sum_k t_eff[b,k] log softmax(x)[b,k]  (see the module docstring).

    Backward. With log p[b,k] = x[b,k] - lse_b and d lse_b / d x[b,j] = p[b,j]:

        dL/dx[b,j] = -(1/B) (t_eff[b,j] - p[b,j] * sum_k t_eff[b,k])
                   = (p[b,j] - t_eff[b,j]) / B          when each target row sums to 1,

    the famous "softmax minus target". For a soft target that requires grad (rare: targets are
    usually constants), dL/dt[b,k] = -(1 - alpha) log p[b,k] / B.

    Hard targets (class ids y) never build the one-hot matrix: the forward reads s[b, y_b] and
    the row sum of the shifted logits s, and the backward is (p - alpha/K, then - (1 - alpha) at
    (b, y_b)) * g / B. Saved: p = softmax(x).
    """

    @staticmethod
    def forward(ctx, logits, target, label_smoothing=0.0):
        xp = array_module(logits)
        B, K = logits.shape
        alpha = label_smoothing
        s = logits - logits.max(axis=1, keepdims=True)       # shifted logits, max 0 per row
        sum_s = s.sum(axis=1)                                 # row sums of s (for smoothing)
        hard = not is_float_dtype(target.dtype)
        if hard:
            picked = s[xp.arange(B), target]                  # s[b, y_b]
            t_mass = 1
        else:
            target = target.astype(s.dtype, copy=False)
            picked = (target * s).sum(axis=1)                 # sum_k t[b,k] s[b,k]
            t_mass = target.sum(axis=1)                       # sum_k t[b,k] (1 for distributions)

        E = xp.exp(s)
        z = E.sum(axis=1)
        lse = xp.log(z)                                       # log sum_k exp(s), in [0, log K]
        p = E / z[:, None]                                    # softmax

        # sum_k t_eff log p = (1 - alpha) (picked - t_mass * lse) + (alpha / K) (sum_s - K * lse)
        loss_rows = (1 - alpha) * (picked - t_mass * lse)
        if alpha:
            loss_rows = loss_rows + (alpha / K) * (sum_s - K * lse)
        loss = -loss_rows.sum() / B

        ctx.hard, ctx.alpha = hard, alpha
        if not hard and ctx.needs_input_grad[1]:
            ctx.log_p = logits - logits.max(axis=1, keepdims=True) - lse[:, None]
        ctx.save_for_backward(p, target)
        return xp.asarray(loss, dtype=logits.dtype)

    @staticmethod
    def backward(ctx, g):
        p, target = ctx.saved_tensors
        xp = array_module(p)
        B, K = p.shape
        alpha = ctx.alpha
        scale = g / B                                         # 0-d array in the logits' dtype
        need_x, need_t = ctx.needs_input_grad[:2]
        dx = dt = None
        if need_x:
            if ctx.hard:
                dx = p - alpha / K                    # a new array: p stays intact
                dx[xp.arange(B), target] -= 1 - alpha
                dx = dx * scale
            else:
                t_eff = target * (1 - alpha) + alpha / K
                dx = (p * t_eff.sum(axis=1, keepdims=True) - t_eff) * scale
        if need_t:
            dt = ctx.log_p * (-(1 - alpha) * scale)
            dt = dt.astype(ctx.input_dtypes[1], copy=False)
        return dx, dt


def cross_entropy(logits, target, label_smoothing=0.0):
    """Mean softmax cross-entropy over the batch (a 0-d Tensor).

    logits: (B, K) Tensor. target: integer class ids of shape (B,) (a Tensor or an array), or
    soft target distributions of shape (B, K) (mixup / cutmix). label_smoothing in [0, 1] mixes
    each target with the uniform distribution: t_eff = (1 - alpha) t + alpha / K.
    """
    require_float("cross_entropy", logits, "logits")
    if logits.ndim != 2:
        raise ValueError(f"cross_entropy: logits must have shape (batch, classes), got {tuple(logits.shape)}")
    B, K = logits.shape
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    xp = array_module(logits.data)
    if not isinstance(target, Tensor):
        target = xp.asarray(target)                # an array or a list: data, put on the logits' device
    t_data = target.data if isinstance(target, Tensor) else target
    if t_data.ndim == 1:
        if is_float_dtype(t_data.dtype) or t_data.dtype == bool:
            raise TypeError(
                f"cross_entropy: a 1-D target must hold integer class ids, got dtype {t_data.dtype}; "
                "pass soft targets as a (batch, classes) array"
            )
        if t_data.shape[0] != B:
            raise ValueError(f"cross_entropy: target of shape {tuple(t_data.shape)} for logits of shape "
                             f"{(B, K)}; expected ({B},) class ids")
        # The range check reads two numbers back to the host: free on the CPU, but on a GPU it would
        # stall every training step, so there out-of-range ids are the data loader's responsibility.
        if B and xp is np and (int(t_data.min()) < 0 or int(t_data.max()) >= K):
            bad = t_data[(t_data < 0) | (t_data >= K)]
            raise ValueError(f"cross_entropy: target class ids must be in [0, {K - 1}] for {K} classes, "
                             f"got {bad[:5].tolist()}")
    elif t_data.ndim == 2:
        if tuple(t_data.shape) != (B, K):
            raise ValueError(f"cross_entropy: soft target of shape {tuple(t_data.shape)} for logits of "
                             f"shape {(B, K)}; expected the same shape")
        if not isinstance(target, Tensor):
            target = target.astype(logits.dtype, copy=False)
        if xp is np and B:   # a host check: on a GPU it would stall every step
            if (t_data < 0).any() or not np.allclose(t_data.sum(axis=1), 1, atol=1e-3):
                sums = t_data.sum(axis=1)
                raise ValueError(
                    "cross_entropy: soft targets must be distributions (entries >= 0, each row summing "
                    f"to 1); got min entry {float(t_data.min()):.3g} and row sums in "
                    f"[{float(sums.min()):.3g}, {float(sums.max()):.3g}]"
                )
    else:
        raise ValueError(f"cross_entropy: target must be class ids (B,) or distributions (B, K), "
                         f"got shape {tuple(t_data.shape)} for logits {(B, K)}")
    return CrossEntropy.apply(logits, target, label_smoothing=float(label_smoothing))
