"""The spatial gating unit (SGU) of gMLP / aMLP, and Toeplitz spatial weights.

The SGU mixes information across tokens with one learned (S, S) matrix and uses the result
as a multiplicative gate. On ``z`` of shape (B, S, 2e), split into a bypass ``z1`` and a gate
``z2`` along channels (the paper's best variant, table 6 of the course work)::

    N   = LayerNorm(z2)                    over the e channels, with gain gamma and shift beta
    F   = W_eff @ N + b[:, None] (+ A)     over the token axis: F[b,i,c] = sum_j W_eff[i,j] N[b,j,c] + b[i]
    out = z1 * F                           (B, S, e)

``W_eff`` is ``W`` (bidirectional) or ``tril(W)`` (causal: token i only sees tokens j <= i),
and ``A`` is the optional aMLP gate residual (the tiny-attention output). The other variants
of table 6 use no split; the LayerNorm then runs over all channels of ``z`` (B, S, e):

    "linear"          out = f(z)
    "additive"        out = z + f(z)
    "multiplicative"  out = z * f(z)
    "split"           out = z1 * f(z2)     (default)

Why one Function for all four: the backward of every variant is the same core (from dL/dF
to dW, db, dA and through the LayerNorm to the gate input) plus one line that differs, the
derivative of the outer product ``out(m, F)``. Four Functions would repeat the core four
times; one Function with a ``variant`` option keeps the lesson in one place. Toeplitz weights
are separate Functions (``Toeplitz1d``, ``Toeplitz2d``) that *build* ``W`` from a few
parameters: their backward (a sum along diagonals) is distinct and composes with the SGU
through autograd.

The LayerNorm math is written privately below (``_ln_forward`` / ``_ln_backward`` on raw
arrays, the efficient form of MODELS.md section 6.3), so that the fused op owns its whole
forward and backward.
"""

from __future__ import annotations

import functools

import numpy as np

from ..autograd import Function
from ..backend import array_module
from ..tensor import Tensor
from . import cuda_kernels

__all__ = ["SpatialGating", "Toeplitz1d", "Toeplitz2d", "spatial_gating", "toeplitz_1d", "toeplitz_2d"]

VARIANTS = ("split", "linear", "additive", "multiplicative")


# --------------------------------------------------------------------------- LayerNorm on arrays
# Row and column sums are mat-vec products with a ones vector: BLAS does them several times
# faster than ``x.sum(axis)`` on the (batch, tokens, channels) arrays of a training step.
def _sum_last(x):
    """sum over the last axis, shape x.shape[:-1]."""
    return x @ array_module(x).ones(x.shape[-1], dtype=x.dtype)


def _sum_leading(x):
    """sum over every axis but the last, shape (x.shape[-1],) (x contiguous)."""
    rows = x.reshape(-1, x.shape[-1])
    return array_module(x).ones(rows.shape[0], dtype=x.dtype) @ rows


def _row_dot(a, b):
    """sum_c a[..., c] * b[..., c] without a temporary (vecdot where the array module has it)."""
    xp = array_module(a)
    vecdot = getattr(xp, "vecdot", None)
    return vecdot(a, b) if vecdot is not None else xp.einsum("...c,...c->...", a, b)


def _ln_forward(x, eps):
    """x_hat = (x - mean) * rstd over the last axis; returns (x_hat, rstd[..., None])."""
    xp = array_module(x)
    if _use_cuda_kernels(x):  # one kernel per row, reading a strided half of z in place
        xhat, rstd = cuda_kernels.layer_norm_normalize(x, eps)
        return xhat, rstd[..., None]
    e = x.shape[-1]
    mean = _sum_last(x)
    mean /= e
    xhat = x - mean[..., None]           # a fresh contiguous array (x may be a strided view)
    var = _row_dot(xhat, xhat)[..., None]
    var /= e
    var += eps
    rstd = xp.sqrt(var, out=var)
    rstd = xp.divide(1, rstd, out=rstd)
    xhat *= rstd
    return xhat, rstd


def _ln_backward(gn, xhat, rstd, gamma, out=None):
    """LayerNorm backward. gn = dL/dN with N = gamma * x_hat + beta (gn is overwritten).

    With g = gn * gamma (the gradient reaching x_hat):
        dL/dgamma = sum_rows gn * x_hat,   dL/dbeta = sum_rows gn,
        dL/dx     = rstd * (g - mean_c(g) - x_hat * mean_c(g * x_hat)).
    The row means are mat-vec products with gamma: mean_c(g) = (gn @ gamma) / e.
    Returns (dL/dx, dL/dgamma, dL/dbeta); dL/dx is written into ``out`` when given (a view
    of a larger gradient, for instance), the only non-contiguous write.
    """
    if _use_cuda_kernels(gn, xhat, rstd, gamma):  # one kernel per row (+ two column sums)
        return cuda_kernels.layer_norm_backward(gn, xhat, rstd[..., 0], gamma, out=out)
    xp = array_module(gn)
    e = xhat.shape[-1]
    gx = gn * xhat
    dgamma, dbeta = _sum_leading(gx), _sum_leading(gn)
    mean_g = (gn @ gamma)[..., None]
    mean_gx = (gx @ gamma)[..., None]
    mean_g /= e
    mean_gx /= e
    g = xp.multiply(gn, gamma, out=gn)
    g -= mean_g
    g -= xp.multiply(xhat, mean_gx, out=gx)
    return xp.multiply(g, rstd, out=out), dgamma, dbeta


# --------------------------------------------------------------------------- the SGU
class SpatialGating(Function):
    """Spatial gating unit (all variants), with a fused hand-derived backward.

    Forward (u = gate input: z2 for "split", z otherwise; W_eff = W or tril(W) when causal)::

        N = gamma * x_hat + beta,  x_hat = (u - mean_c u) / sqrt(var_c u + eps)
        F[b,i,c] = sum_j W_eff[i,j] N[b,j,c] + bias[i] + A[b,i,c]
        out = z1 * F  |  F  |  u + F  |  u * F            (split | linear | additive | multiplicative)

    By linearity F = (W_eff @ x_hat) * gamma + (W_eff 1) beta^T + bias 1^T (+ A): N itself is
    never stored, and the second and third terms are one (S, e) matrix broadcast over the batch.

    Backward, with G = dL/dout. The outer product gives dL/dF and a direct term:

        split:           G_F = G * z1,  dL/dz1 = G * F
        linear:          G_F = G
        additive:        G_F = G,       dL/du += G
        multiplicative:  G_F = G * u,   dL/du += G * F

    The token projection is linear in W, N, bias and A:

        dL/dA          = G_F
        dL/dbias[i]    = sum_{b,c} G_F[b,i,c]
        dL/dW[i,j]     = sum_{b,c} G_F[b,i,c] N[b,j,c]   = sum_b G_F[b] @ N[b]^T   (then tril if causal:
                                                            masked entries never touched the output)
        G_N[b,j,c]     = sum_i W_eff[i,j] G_F[b,i,c]      = W_eff^T @ G_F[b]

    and G_N goes through the LayerNorm backward (``_ln_backward``) to dL/du, dL/dgamma, dL/dbeta.
    ``W_eff @ x_hat`` is one matmul of an (S, S) matrix with a (B, S, e) stack (broadcast over B);
    BLAS reads ``W_eff^T`` and ``N[b]^T`` as transposed views, so no transposed copy is made.
    (``sum_b G_F[b] @ N[b]^T`` as a batched product then a sum measured faster than a
    ``tensordot`` over (b, c), which copies both operands into (S, B*e) layouts.)

    Saved: z, W_eff, gamma, beta, x_hat, rstd and F (when the variant needs it); N is rebuilt
    from x_hat in backward (one pass) into a buffer that then receives G_N.

    On CUDA the LayerNorm runs as one kernel per row, and for the split variant F and z1 * F
    (forward) and G * F, G * z1 (backward) are one fused pass each (``cuda_kernels``, tested
    against this code).
    """

    @staticmethod
    def forward(ctx, z, weight, bias, norm_weight, norm_bias, gate_residual=None, *,
                eps=1e-5, causal=False, variant="split"):
        xp = array_module(z)
        dt = z.dtype  # constants of another float dtype are computed in z's dtype
        weight, bias = weight.astype(dt, copy=False), bias.astype(dt, copy=False)
        gamma, beta = norm_weight.astype(dt, copy=False), norm_bias.astype(dt, copy=False)

        e = z.shape[-1] // 2 if variant == "split" else z.shape[-1]
        u = z[..., e:] if variant == "split" else z
        w_eff = xp.tril(weight) if causal else weight

        xhat, rstd = _ln_forward(u, eps)
        f = w_eff @ xhat                       # (S, S) @ (B, S, e): W_eff applied to every sample
        shift = _sum_last(w_eff)[:, None] * beta + bias[:, None]     # (S, e), shared by the batch
        residual = gate_residual.astype(dt, copy=False) if gate_residual is not None else None
        if variant == "split" and _use_cuda_kernels(z):   # F and z1 * F in one pass on CUDA
            out = cuda_kernels.sgu_gate_forward(f, gamma, shift, z[..., :e], residual)
        else:
            f *= gamma
            f += shift
            if residual is not None:
                f += residual
            if variant == "split":
                out = z[..., :e] * f
            elif variant == "multiplicative":
                out = z * f
            elif variant == "additive":
                out = z + f
            else:  # linear
                out = f
        ctx.variant, ctx.causal, ctx.e = variant, causal, e
        ctx.save_for_backward(z, w_eff, gamma, beta, xhat, rstd,
                              f if variant in ("split", "multiplicative") else None)
        return out

    @staticmethod
    def backward(ctx, g):
        z, w_eff, gamma, beta, xhat, rstd, f = ctx.saved_tensors
        need_z, need_w, need_b, need_gamma, need_beta, need_a = ctx.needs_input_grad
        xp = array_module(g)
        variant, e = ctx.variant, ctx.e

        # dL/dF, and the direct term of the outer product (written straight into dL/dz)
        dz = xp.empty_like(z) if need_z else None
        if variant == "split" and need_z and _use_cuda_kernels(g, z):   # both products in one pass
            _, gf = cuda_kernels.sgu_gate_backward(g, f, z[..., :e], dz1=dz[..., :e])
        elif variant == "split":
            gf = g * z[..., :e]
            if need_z:
                xp.multiply(g, f, out=dz[..., :e])
        elif variant == "multiplicative":
            gf = g * z
        else:
            gf = g

        # the token projection
        dw = db = work = None
        if need_w:
            work = xhat * gamma
            work += beta                                        # N, rebuilt
            dw = xp.matmul(gf, work.swapaxes(1, 2)).sum(axis=0)  # sum_b G_F[b] @ N[b]^T
            if ctx.causal:
                dw = xp.tril(dw)
        if need_b:
            db = _sum_last(gf).sum(axis=0)
        da = gf if need_a else None

        # back through the LayerNorm to the gate input u
        dgamma = dbeta = None
        if need_z or need_gamma or need_beta:
            gn = xp.matmul(w_eff.T, gf, out=work)              # W_eff^T @ G_F[b] for every b
            du = None
            if need_z:
                du = dz[..., e:] if variant == "split" else dz
            du, dgamma, dbeta = _ln_backward(gn, xhat, rstd, gamma, out=du)
            if variant == "multiplicative" and need_z:
                dz += g * f
            elif variant == "additive" and need_z:
                dz += g

        grads = (dz, dw, db, dgamma, dbeta, da)
        return tuple(_like(gr, inp) for gr, inp in zip(grads, ctx.inputs))


def _use_cuda_kernels(*arrays):
    """CuPy arrays of one float dtype: the fused kernels of ``cuda_kernels`` apply."""
    return array_module(arrays[0]).__name__ == "cupy" and cuda_kernels.supported(*arrays)


def _like(grad, inp):
    """The gradient in its input's dtype (inputs of another float dtype were cast in forward)."""
    if grad is None or not isinstance(inp, Tensor) or grad.dtype == inp.dtype:
        return grad
    return grad.astype(inp.dtype)


# --------------------------------------------------------------------------- Toeplitz weights
@functools.lru_cache(maxsize=32)
def _toeplitz_index(grid_h, grid_w):
    """IDX[(r,c),(r',c')] = (r-r'+gh-1) * (2gw-1) + (c-c'+gw-1): the flat position in w (2gh-1, 2gw-1).

    With grid_h = 1 this is the 1-D index IDX[i,j] = i - j + S - 1 into w (2S-1,).
    """
    r, c = np.divmod(np.arange(grid_h * grid_w), grid_w)
    dr = r[:, None] - r[None, :] + grid_h - 1
    dc = c[:, None] - c[None, :] + grid_w - 1
    idx = dr * (2 * grid_w - 1) + dc
    idx.setflags(write=False)
    return idx


def _index_on(xp, grid_h, grid_w):
    idx = _toeplitz_index(grid_h, grid_w)
    return idx if xp is np else xp.asarray(idx)


class _Toeplitz(Function):
    """W = w.ravel()[IDX]: a gather; its backward is the scatter-add dL/dw[k] = sum_{IDX[i,j]=k} G_W[i,j].

    Each parameter is shared by every (i, j) on its diagonal, so its gradient is the sum of
    G_W along that diagonal (``bincount`` with weights: one pass over G_W).
    """

    @staticmethod
    def forward(ctx, w, grid_h, grid_w):
        xp = array_module(w)
        idx = _index_on(xp, grid_h, grid_w)
        ctx.idx, ctx.shape = idx, w.shape
        return w.ravel()[idx]

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        k = int(np.prod(ctx.shape))
        dw = xp.bincount(ctx.idx.ravel(), weights=g.ravel(), minlength=k)  # float64 sums
        return dw.astype(g.dtype, copy=False).reshape(ctx.shape)


class Toeplitz1d(_Toeplitz):
    """W[i, j] = w[i - j + S - 1] from w of shape (2S - 1,): one weight per diagonal.

    w[S-1] is the main diagonal, w[S-1+k] the k-th diagonal below it (i - j = k), w[S-1-k]
    the k-th above. Backward: dL/dw[k] = sum of dL/dW along diagonal k - S + 1.
    """

    @staticmethod
    def forward(ctx, w, seq_len):
        return _Toeplitz.forward(ctx, w, 1, seq_len)


class Toeplitz2d(_Toeplitz):
    """Doubly-Toeplitz W for tokens on a (gh, gw) grid in row-major order, token t = (r, c):

        W[(r,c), (r',c')] = w[r - r' + gh - 1, c - c' + gw - 1],   w of shape (2gh - 1, 2gw - 1).

    The weight depends only on the 2-D offset between two patches (a convolution over the
    grid, with a kernel as large as the image). Backward: dL/dw[p, q] = sum of dL/dW over the
    token pairs with that offset.
    """

    @staticmethod
    def forward(ctx, w, grid_h, grid_w):
        return _Toeplitz.forward(ctx, w, grid_h, grid_w)


# --------------------------------------------------------------------------- functional API
def _shape_error(msg):
    return ValueError(f"spatial_gating: {msg}")


def spatial_gating(z, weight, bias, norm_weight, norm_bias, eps=1e-5, gate_residual=None,
                   causal=False, variant="split"):
    """The gMLP spatial gating unit (see ``SpatialGating`` for the formulas).

    z (B, S, 2e) for variant "split", else (B, S, e); weight (S, S) (dense, or built by
    ``toeplitz_1d`` / ``toeplitz_2d``); bias (S,); norm_weight, norm_bias (e,);
    gate_residual (B, S, e) or None (aMLP: added to f before the gating product).
    Returns (B, S, e).
    """
    if variant not in VARIANTS:
        raise ValueError(f"spatial_gating: unknown variant {variant!r}, expected one of {VARIANTS}")
    if z.ndim != 3:
        raise _shape_error(f"z must have shape (batch, tokens, channels), got {tuple(z.shape)}")
    B, S, D = z.shape
    if variant == "split":
        if D % 2:
            raise _shape_error(f'variant "split" needs an even channel count to split z into z1, z2; '
                               f"got z of shape {tuple(z.shape)}")
        e = D // 2
    else:
        e = D
    expected = {"weight": (S, S), "bias": (S,), "norm_weight": (e,), "norm_bias": (e,)}
    given = {"weight": weight, "bias": bias, "norm_weight": norm_weight, "norm_bias": norm_bias}
    if gate_residual is not None:
        expected["gate_residual"] = (B, S, e)
        given["gate_residual"] = gate_residual
    for name, shape in expected.items():
        if tuple(given[name].shape) != shape:
            raise _shape_error(
                f"{name} has shape {tuple(given[name].shape)}, expected {shape} "
                f"for z of shape {tuple(z.shape)} (variant {variant!r}, S={S}, e={e})"
            )
    return SpatialGating.apply(z, weight, bias, norm_weight, norm_bias, gate_residual,
                               eps=eps, causal=bool(causal), variant=variant)


def toeplitz_1d(w, seq_len):
    """(S, S) Toeplitz matrix W[i, j] = w[i - j + S - 1] from w of shape (2S - 1,), S = seq_len."""
    if w.ndim != 1 or w.shape[0] != 2 * seq_len - 1:
        raise ValueError(f"toeplitz_1d: w must have shape ({2 * seq_len - 1},) = (2*seq_len - 1,) "
                         f"for seq_len={seq_len}, got {tuple(w.shape)}")
    return Toeplitz1d.apply(w, seq_len)


def toeplitz_2d(w, grid_h, grid_w):
    """(S, S) doubly-Toeplitz matrix, S = grid_h * grid_w, from w of shape (2*grid_h - 1, 2*grid_w - 1)."""
    shape = (2 * grid_h - 1, 2 * grid_w - 1)
    if tuple(w.shape) != shape:
        raise ValueError(f"toeplitz_2d: w must have shape {shape} = (2*grid_h - 1, 2*grid_w - 1) "
                         f"for a {grid_h}x{grid_w} grid, got {tuple(w.shape)}")
    return Toeplitz2d.apply(w, grid_h, grid_w)
