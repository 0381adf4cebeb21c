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

The LayerNorm math is that of norm.py on plain arrays (``normalize``, ``layer_norm_backward``),
called inside the fused op, which so owns its whole forward and backward.
"""

from __future__ import annotations

import functools

import numpy as np

from ..autograd import Function
from ..backend import array_module
from . import cuda_kernels
from .norm import layer_norm_backward, normalize, row_sum

__all__ = ["SpatialGating", "Toeplitz1d", "Toeplitz2d", "spatial_gating", "toeplitz_1d", "toeplitz_2d"]

VARIANTS = ("split", "linear", "additive", "multiplicative")


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
        dL/dW[i,j]     = sum_{b,c} G_F[b,i,c] N[b,j,c]   (then tril if causal: masked entries
                                                            never touched the output)
        G_N[b,j,c]     = sum_i W_eff[i,j] G_F[b,i,c]

    and G_N goes through the LayerNorm backward (``layer_norm_backward``) to dL/du, dL/dgamma, dL/dbeta.

    Layout. Inside the op the arrays are *token-major*: x_hat, F, G_F are (S, B, e), the
    token axis first. Then the token mixing is ONE matrix product for the whole batch: with
    X = x_hat seen as an (S, B*e) matrix, W_eff @ X is (S, S) @ (S, B*e), and so are
    dL/dW = G_F N^T (a sum over b and c at once) and G_N = W_eff^T G_F. In the (B, S, e)
    layout each of the three is B small products (S, S) @ (S, e), which BLAS runs several
    times slower, worst with 2 threads. The LayerNorm and the gating are row- or elementwise
    and do not care about the order of the rows. ``token_axis`` says where the tokens are in
    z, the gate residual and the output: axis 1, (B, S, .), by default (the op then reads and
    writes them through transposed views ``zt = z.transpose(1, 0, 2)``, which costs strided
    passes), or axis 0, (S, B, .), for a model that keeps its activations token-major.

    Saved: what backward reads of z (z1 for "split", copied so that the memory of z2 can be
    freed; z for "multiplicative"; nothing otherwise), W_eff, gamma, beta, x_hat, rstd and F
    (when the variant needs it), in the layout of z (views of the token-major arrays). N is
    rebuilt from x_hat in backward (one pass) into a buffer that then receives G_N; on the last
    backward G_F takes the memory of F, and the LayerNorm backward that of x_hat.

    On CUDA the LayerNorm runs as one kernel per row, and for the split variant F and z1 * F
    (forward) and G * F, G * z1 (backward) are one fused pass each (``cuda_kernels``, tested
    against this code).
    """

    @staticmethod
    def forward(ctx, z, weight, bias, norm_weight, norm_bias, gate_residual=None, *,
                eps=1e-5, causal=False, variant="split", token_axis=1):
        xp = array_module(z)
        dt = z.dtype  # constants of another float dtype are computed in z's dtype
        weight, bias = weight.astype(dt, copy=False), bias.astype(dt, copy=False)
        gamma, beta = norm_weight.astype(dt, copy=False), norm_bias.astype(dt, copy=False)

        tm = _token_major if token_axis == 1 else _same            # (B, S, .) <-> (S, B, .) views
        zt = tm(z)                                                  # (S, B, 2e or e)
        S, B, _ = zt.shape
        e = z.shape[-1] // 2 if variant == "split" else z.shape[-1]
        ut = zt[..., e:] if variant == "split" else zt
        w_eff = xp.tril(weight) if causal else weight

        xhat, rstd = normalize(ut, eps)                             # (S, B, e), contiguous
        # what backward reads of z: z1 (split), as a contiguous copy so that z2's memory can go
        # once nothing else holds z; all of z (multiplicative); nothing (additive, linear)
        kept = None
        if variant == "split":
            kept = xp.ascontiguousarray(zt[..., :e])
        elif variant == "multiplicative":
            kept = zt
        f = (w_eff @ xhat.reshape(S, -1)).reshape(S, B, e)          # W_eff @ x_hat: one GEMM
        shift = row_sum(w_eff)[:, None] * beta + bias[:, None]      # (S, e), shared by the batch
        residual = tm(gate_residual.astype(dt, copy=False)) if gate_residual is not None else None
        if variant == "split" and cuda_kernels.applies(z):   # F and z1 * F in one pass on CUDA
            out = tm(cuda_kernels.sgu_gate_forward(f, gamma, shift[:, None], kept, residual))
        else:
            f *= gamma
            f += shift[:, None]
            if residual is not None:
                f += residual
            out = xp.empty(z.shape[:-1] + (e,), dtype=dt)   # contiguous in z's layout, written
            out_t = tm(out)                                 # through its token-major view
            if variant in ("split", "multiplicative"):
                xp.multiply(kept, f, out=out_t)
            elif variant == "additive":
                xp.add(zt, f, out=out_t)
            else:  # linear
                out_t[...] = f
        ctx.variant, ctx.causal, ctx.e, ctx.tm = variant, causal, e, tm
        keep_f = variant in ("split", "multiplicative")   # saved in z's layout (views), like z
        ctx.save_for_backward(tm(kept) if kept is not None else None, w_eff, gamma, beta,
                              tm(xhat), tm(rstd), tm(f) if keep_f else None)
        return out

    @staticmethod
    def backward(ctx, g):
        kept, w_eff, gamma, beta, xhat, rstd, f = ctx.pop_saved()
        need_z, need_w, need_b, need_gamma, need_beta, need_a = ctx.needs_input_grad
        xp = array_module(g)
        variant, e, tm = ctx.variant, ctx.e, ctx.tm
        last = not ctx.retain_graph       # the saved arrays may then serve as buffers
        kt, gt = (tm(kept) if kept is not None else None), tm(g)   # token-major views
        xhat, rstd = tm(xhat), tm(rstd)                             # contiguous again
        ft = tm(f) if f is not None else None
        del kept, f
        S = xhat.shape[0]

        # dL/dF (token-major, contiguous), and the direct term of the outer product (written
        # straight into dL/dz, contiguous in z's layout, through its token-major view)
        dz = xp.empty(ctx.input_shapes[0], dtype=ctx.input_dtypes[0]) if need_z else None
        dzt = tm(dz) if need_z else None
        if variant == "split" and need_z and cuda_kernels.applies(g, kt):   # both products in one pass
            _, gf = cuda_kernels.sgu_gate_backward(gt, ft, kt, dz1=dzt[..., :e])
        elif variant == "split":
            if need_z:
                xp.multiply(gt, ft, out=dzt[..., :e])               # dL/dz1 = G * F: F's last use,
            gf = xp.multiply(gt, kt, out=ft if last else xp.empty_like(xhat))   # so G_F may take its place
        elif variant == "multiplicative":
            gf = xp.multiply(gt, kt, out=xp.empty_like(xhat))
        else:
            gf = xp.ascontiguousarray(gt)
        del kt
        gf2 = gf.reshape(S, -1)                                     # G_F as an (S, B*e) matrix

        # the token projection: one GEMM each
        dw = db = work = None
        if need_w:
            work = xhat * gamma
            work += beta                                            # N, rebuilt
            dw = gf2 @ work.reshape(S, -1).T                        # G_F N^T: sum over b and c
            if ctx.causal:
                dw = xp.tril(dw)
        if need_b:
            db = row_sum(gf2)
        da = tm(gf) if need_a else None

        # back through the LayerNorm to the gate input u
        dgamma = dbeta = None
        if need_z or need_gamma or need_beta:
            if work is None:
                work = xp.empty_like(xhat)
            gn = xp.matmul(w_eff.T, gf2, out=work.reshape(S, -1)).reshape(xhat.shape)   # W_eff^T G_F
            du = (dzt[..., e:] if variant == "split" else dzt) if need_z else None
            du, dgamma, dbeta = layer_norm_backward(
                gn, xhat, rstd, gamma, out=du, need_dx=need_z, need_dweight=need_gamma, need_dbias=need_beta,
                overwrite_g=True, overwrite_xhat=last)
            if variant == "multiplicative" and need_z:
                dzt += gt * ft
            elif variant == "additive" and need_z:
                dzt += gt

        grads = (dz, dw, db, dgamma, dbeta, da)
        return tuple(_like(gr, dtype) for gr, dtype in zip(grads, ctx.input_dtypes))


def _token_major(a):
    """(B, S, .) <-> (S, B, .): swap the first two axes (a view)."""
    return a.transpose(1, 0, 2)


def _same(a):
    return a


def _like(grad, dtype):
    """The gradient in its input's dtype (inputs of another float dtype were cast in forward)."""
    if grad is None or dtype is None or grad.dtype == dtype:
        return grad
    return grad.astype(dtype)


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
                   causal=False, variant="split", token_axis=1):
    """The gMLP spatial gating unit (see ``SpatialGating`` for the formulas).

    z (B, S, 2e) for variant "split", else (B, S, e); weight (S, S) (dense, or built by
    ``toeplitz_1d`` / ``toeplitz_2d``); bias (S,); norm_weight, norm_bias (e,);
    gate_residual (B, S, e) or None (aMLP: added to f before the gating product).
    Returns (B, S, e). With ``token_axis=0`` z, gate_residual and the result are token-major,
    (S, B, .) (faster: see ``SpatialGating``).
    """
    if variant not in VARIANTS:
        raise ValueError(f"spatial_gating: unknown variant {variant!r}, expected one of {VARIANTS}")
    if token_axis not in (0, 1):
        raise ValueError(f"spatial_gating: token_axis must be 1 (z is (B, S, D)) or 0 (z is (S, B, D)), "
                         f"got {token_axis!r}")
    layout = "(batch, tokens, channels)" if token_axis == 1 else "(tokens, batch, channels)"
    if z.ndim != 3:
        raise _shape_error(f"z must have shape {layout}, got {tuple(z.shape)}")
    S, D = (z.shape[1], z.shape[2]) if token_axis == 1 else (z.shape[0], z.shape[2])
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
        expected["gate_residual"] = z.shape[:-1] + (e,)
        given["gate_residual"] = gate_residual
    for name, shape in expected.items():
        if tuple(given[name].shape) != shape:
            raise _shape_error(
                f"{name} has shape {tuple(given[name].shape)}, expected {shape} "
                f"for z of shape {tuple(z.shape)} (variant {variant!r}, S={S}, e={e})"
            )
    return SpatialGating.apply(z, weight, bias, norm_weight, norm_bias, gate_residual,
                               eps=eps, causal=bool(causal), variant=variant, token_axis=token_axis)


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
