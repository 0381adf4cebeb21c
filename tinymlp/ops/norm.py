"""Layer normalisation over the last axis, with its backward in the efficient form."""

from __future__ import annotations

from ..autograd import Function
from ..backend import array_module
from . import cuda_kernels


class LayerNorm(Function):
    r"""y = gamma * x_hat + beta over the last axis (width D) of x; gamma, beta of shape (D,).

    Per row:  mu = (1/D) sum_j x_j,  var = (1/D) sum_j (x_j - mu)^2,  r = 1/sqrt(var + eps),
              x_hat = (x - mu) r.

    Backward, with G = dL/dy:
      dL/dbeta  = sum over rows of G,   dL/dgamma = sum over rows of G * x_hat.
      For one row, let g = G * gamma = dL/dx_hat. Differentiate x_hat_i = (x_i - mu) r:
          dx_hat_i/dx_j = r (delta_ij - 1/D) + (x_i - mu) dr/dx_j,
          dr/dx_j = -r^3/2 dvar/dx_j = -r^3 (x_j - mu)/D = -(r^2/D) x_hat_j,
      since dvar/dx_j = 2 (x_j - mu)/D (the terms through mu sum to zero). So
          dx_hat_i/dx_j = r (delta_ij - 1/D - x_hat_i x_hat_j / D), and

          dL/dx_j = sum_i g_i dx_hat_i/dx_j = r ( g_j - mean(g) - x_hat_j mean(g * x_hat) ).

    That needs only x_hat and r, which forward saves (not x, mu and var to recompute them).
    A constant row has var = 0: r = 1/sqrt(eps) stays finite, x_hat = 0, y = beta.
    Every sum over rows or columns is one einsum (a single pass that allocates nothing of the
    input's size); the rest is in-place arithmetic. ``weight`` or ``bias`` may be None.
    On CUDA, forward and backward each run as one kernel per row (``cuda_kernels``, tested
    against this code).
    """

    @staticmethod
    def forward(ctx, x, weight, bias, eps=1e-5):
        _check_shapes(x, weight, bias)
        xp = array_module(x)
        d = x.shape[-1]
        if _use_cuda_kernels(x, weight, bias):
            y, x_hat, r = cuda_kernels.layer_norm_forward(x, weight, bias, eps)
            ctx.save_for_backward(x_hat.reshape(-1, d), r.reshape(-1), weight)
            ctx.has_bias = bias is not None
            return y
        x2 = x.reshape(-1, d)
        x_hat = x2 - (xp.einsum("nd->n", x2) / d)[:, None]      # x - mu (two passes: accurate)
        var = xp.einsum("nd,nd->n", x_hat, x_hat) / d
        r = 1 / xp.sqrt(var + eps)
        x_hat *= r[:, None]
        y = x_hat * weight if weight is not None else x_hat.copy()
        if bias is not None:
            y += bias
        ctx.save_for_backward(x_hat, r, weight)
        ctx.has_bias = bias is not None
        return y.reshape(x.shape)

    @staticmethod
    def backward(ctx, grad):
        x_hat, r, weight = ctx.pop_saved()
        need_x, need_w, need_b = ctx.needs_input_grad
        xp = array_module(grad)
        d = x_hat.shape[1]
        if _use_cuda_kernels(grad, x_hat, r, weight):
            dx, dweight, dbias = cuda_kernels.layer_norm_backward(
                grad.reshape(-1, d), x_hat, r, weight,
                need_dx=need_x, need_dweight=need_w, need_dbias=need_b and ctx.has_bias,
            )
            return (dx.reshape(grad.shape) if dx is not None else None), dweight, dbias
        # grad may be a broadcast view (after a mean): read it as it is, without a copy
        rows = "abcdefghijklmnopqrstuvwxy"[:grad.ndim - 1]
        dweight = xp.einsum(f"{rows}z,{rows}z->z", grad, x_hat.reshape(grad.shape)) if need_w else None
        dbias = xp.einsum(f"{rows}z->z", grad) if (need_b and ctx.has_bias) else None
        dx = None
        if need_x:
            g = grad * weight if weight is not None else grad.copy()  # dL/dx_hat (a new array)
            g = g.reshape(-1, d)
            mean_g = xp.einsum("nd->n", g) / d
            mean_gx = xp.einsum("nd,nd->n", g, x_hat) / d
            g -= mean_g[:, None]
            # x_hat * mean_gx, in x_hat's own memory on the last backward (its last use)
            g -= xp.multiply(x_hat, mean_gx[:, None], out=None if ctx.retain_graph else x_hat)
            g *= r[:, None]
            dx = g.reshape(grad.shape)
        return dx, dweight, dbias


def _use_cuda_kernels(*arrays):
    return array_module(arrays[0]).__name__ == "cupy" and cuda_kernels.supported(*arrays)


def _check_shapes(x, weight, bias):
    if x.ndim == 0:
        raise ValueError("layer_norm: the input must have at least one axis (it normalises the last one)")
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
    return LayerNorm.apply(x, weight, bias, eps=eps)
