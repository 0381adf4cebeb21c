"""The spatial gating unit (SGU) of gMLP / aMLP, and Toeplitz spatial weights.

The SGU mixes information across tokens with one learned (S, S) matrix and uses the result
as a multiplicative gate. On ``z`` of shape (B, S, 2e), split into a bypass ``z1`` and a gate
``z2`` along channels (the paper's best variant, table 6 of the course work)::

    N   = LayerNorm(z2)                    over the e channels, with gain gamma and shift beta
    F   = W N + b 1^T (+ A)                over the tokens: F[b,i,c] = sum_j W[i,j] N[b,j,c] + b[i]
    out = z1 * F                           (B, S, e)

``W`` may be lower-triangular (causal: token i only sees tokens j <= i), and ``A`` is the
optional aMLP gate residual (the tiny-attention output). The other variants of table 6 use no
split; the LayerNorm then runs over all channels of ``z`` (B, S, e), and only the last line
differs:

    "linear"          out = F
    "additive"        out = z + F
    "multiplicative"  out = z * F
    "split"           out = z1 * F      (default)

Toeplitz weights are separate Functions (``Toeplitz1d``, ``Toeplitz2d``) that *build* ``W``
from a few parameters: their backward (a sum along diagonals) composes with the SGU's.

Fast tier: ``tinymlp/fast/gating.py`` (the token mixing as one matrix product for the whole
batch when the tokens lie token-major in memory, buffers reused, fused CUDA kernels).
"""

from __future__ import annotations

import functools

import numpy as np

from ..autograd import Function
from ..backend import array_module, device_constant
from .norm import normalize, normalize_backward

__all__ = ["SpatialGating", "Toeplitz1d", "Toeplitz2d", "spatial_gating", "toeplitz_1d", "toeplitz_2d"]

VARIANTS = ("split", "linear", "additive", "multiplicative")


# --------------------------------------------------------------------------- the SGU
class SpatialGating(Function):
    r"""Spatial gating unit (all variants), with a fused hand-derived backward.

    Forward, on u = the gate input (z2 for "split", z otherwise)::

        x_hat, rstd = normalize(u),   N = gamma * x_hat + beta          (LayerNorm over channels)
        F[b] = W N[b] + bias 1^T + A[b]                                 (W lower-triangular if causal)
        out = z1 * F  |  F  |  u + F  |  u * F         (split | linear | additive | multiplicative)

    Backward, with G = dL/dout. The outer product gives dL/dF and a direct term:

        split:           G_F = G * z1,  dL/dz1 = G * F
        linear:          G_F = G
        additive:        G_F = G,       dL/du += G
        multiplicative:  G_F = G * u,   dL/du += G * F

    The token projection is linear in W, N, bias and A (the rules of a matrix product, summed
    over the batch b and the channels c):

        dL/dA          = G_F
        dL/dbias[i]    = sum_{b,c} G_F[b,i,c]
        dL/dW          = sum_b G_F[b] N[b]^T       (then tril if causal: masked entries never
                                                    touched the output)
        G_N[b]         = W^T G_F[b]

    and G_N goes back through the LayerNorm: dL/dgamma = sum G_N * x_hat, dL/dbeta = sum G_N,
    dL/du += normalize_backward(G_N * gamma, x_hat, rstd) (norm.py has its derivation).
    """

    @staticmethod
    def forward(ctx, z, weight, bias, norm_weight, norm_bias, gate_residual=None, *,
                eps=1e-5, causal=False, variant="split"):
        xp = array_module(z)
        e = z.shape[-1] // 2 if variant == "split" else z.shape[-1]
        z1, u = (z[..., :e], z[..., e:]) if variant == "split" else (None, z)   # bypass, gate input
        x_hat, rstd = normalize(u, eps)
        N = x_hat * norm_weight + norm_bias                   # LayerNorm(u)         (B, S, e)
        W = xp.tril(weight) if causal else weight
        F = W @ N + bias[:, None]                             # mix the tokens       (B, S, e)
        if gate_residual is not None:
            F = F + gate_residual                             # aMLP: + TinyAttn(X^)
        if variant == "split":
            out = z1 * F
        elif variant == "multiplicative":
            out = u * F
        elif variant == "additive":
            out = u + F
        else:                                                 # linear
            out = F
        ctx.save_for_backward(z1, u, x_hat, rstd, W, norm_weight, norm_bias, F)
        ctx.variant, ctx.causal = variant, causal
        return out

    @staticmethod
    def backward(ctx, grad):
        z1, u, x_hat, rstd, W, gamma, beta, F = ctx.saved_tensors
        xp = array_module(grad)
        variant = ctx.variant
        # the outer product: dL/dF, and the direct term of dL/du
        if variant == "split":                                # out = z1 * F
            G_F, dz1, du = grad * z1, grad * F, 0
        elif variant == "multiplicative":                     # out = u * F
            G_F, du = grad * u, grad * F
        elif variant == "additive":                           # out = u + F
            G_F, du = grad, grad
        else:                                                 # out = F
            G_F, du = grad, 0
        # the token projection F = W N + bias 1^T + A
        N = x_hat * gamma + beta
        dW = (G_F @ N.swapaxes(-1, -2)).sum(axis=0)           # sum_b G_F[b] N[b]^T
        if ctx.causal:
            dW = xp.tril(dW)
        dbias = G_F.sum(axis=(0, 2))
        G_N = W.T @ G_F                                       # W^T G_F[b]
        # the LayerNorm
        dgamma = (G_N * x_hat).sum(axis=(0, 1))
        dbeta = G_N.sum(axis=(0, 1))
        du = du + normalize_backward(G_N * gamma, x_hat, rstd)
        dz = xp.concatenate([dz1, du], axis=-1) if variant == "split" else du
        return dz, dW, dbias, dgamma, dbeta, G_F


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
    return device_constant(xp, ("toeplitz_index", grid_h, grid_w), lambda: _toeplitz_index(grid_h, grid_w))


class _Toeplitz(Function):
    """W = w.ravel()[IDX]: a gather; its backward is the scatter-add dL/dw[k] = sum_{IDX[i,j]=k} G_W[i,j].

    Each parameter is shared by every (i, j) on its diagonal, so its gradient is the sum of
    G_W along that diagonal: ``add.at`` adds every G_W[i, j] into dL/dw[IDX[i, j]], repeated
    indices accumulating.
    """

    @staticmethod
    def forward(ctx, w, grid_h, grid_w):
        xp = array_module(w)
        idx = _index_on(xp, grid_h, grid_w)
        ctx.idx, ctx.shape = idx, w.shape
        return w.ravel()[idx]

    @staticmethod
    def backward(ctx, g):
        dw = array_module(g).zeros(ctx.shape, dtype=g.dtype)
        array_module(g).add.at(dw.reshape(-1), ctx.idx, g)
        return dw


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
    gate_residual (B, S, e) or None (aMLP: added to F before the gating product).
    Returns (B, S, e).
    """
    if variant not in VARIANTS:
        raise ValueError(f"spatial_gating: unknown variant {variant!r}, expected one of {VARIANTS}")
    if z.ndim != 3:
        raise _shape_error(f"z must have shape (batch, tokens, channels), got {tuple(z.shape)}")
    _, S, D = z.shape
    if variant == "split" and D % 2:
        raise _shape_error(f'variant "split" needs an even channel count to split z into z1, z2; '
                           f"got z of shape {tuple(z.shape)}")
    e = D // 2 if variant == "split" else D
    expected = {"weight": (S, S), "bias": (S,), "norm_weight": (e,), "norm_bias": (e,)}
    given = {"weight": weight, "bias": bias, "norm_weight": norm_weight, "norm_bias": norm_bias}
    if gate_residual is not None:
        expected["gate_residual"] = z.shape[:-1] + (e,)
        given["gate_residual"] = gate_residual
    for name, shape in expected.items():
        if tuple(given[name].shape) != shape:
            raise _shape_error(
                f"{name} has shape {tuple(given[name].shape)}, expected {shape} "
                f"for z of shape {tuple(z.shape)} (variant {variant!r}, S={S}, e={e})"
            )
        if given[name].dtype != z.dtype:
            raise TypeError(f"spatial_gating: {name} is {given[name].dtype} but z is {z.dtype}; "
                            "convert with .astype()")
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
