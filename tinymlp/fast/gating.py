"""The spatial gating unit, fast: one matrix product per token mixing, buffers reused.

The reference (ops/gating.py) computes W N[b] for every sample b: B small (S, S) @ (S, e)
products, and as many for dL/dW and G_N. Here the arrays are handled *token-major*: x_hat, F
and G_F are (S, B, e), so that, with X = x_hat seen as an (S, B*e) matrix,

    W X = (S, S) @ (S, B*e),   dL/dW = G_F N^T,   G_N = W^T G_F

are ONE product each for the whole batch. When z lies token-major in memory (the fast patch
embedding's layout, kept by every fast op) these are views; otherwise they are read through
strided views. The output and dL/dz are laid out like z.

By linearity F = (W x_hat) * gamma + (W 1) beta^T + bias 1^T (+ A): N is never stored, and the
last terms are one (S, e) matrix broadcast over the batch. Saved: z1 (split; copied, so that
z2's memory can go) or z (multiplicative), W, gamma, beta, x_hat, rstd and F where the variant
needs it. N is rebuilt in backward into a buffer that then receives G_N; on the last backward
G_F takes the memory of F, and the LayerNorm backward that of x_hat. The compiled split SGU saves
z itself instead of z1's copy and x_hat (as much memory) and writes less (``CompiledSpatialGating``).

Three implementations, one per back end. ``FastSpatialGating`` is the NumPy code (and the same
array code on CuPy); ``CompiledSpatialGating`` (CPU, numba installed) and ``CudaSpatialGating``
(CUDA) replace three of its steps with kernels where the arrays suit them: the LayerNorm of z2
(``norm``: the LayerNorm class of the same back end), the split variant's F and z1 * F forward
and G * F, G * z1 backward (``split_gate``, ``split_gate_backward``: one fused pass each), and,
compiled, the rebuilt N (``affine``); on CUDA the products go through cuBLAS calls a CUDA graph
can capture (``product``). Kernels: ``kernels/gating_numba.py``, ``kernels/gating_cuda.py``.
"""

from __future__ import annotations

import numpy as np

from ..backend import array_module
from ..ops.gating import SpatialGating
from . import compiled, cublas, cuda
from .engine import last_backward, take_saved
from .kernels import gating_cuda, gating_numba
from .layout import empty_token_major, token_major_view
from .norm import CompiledLayerNorm, CudaLayerNorm, FastLayerNorm, backward_rows, row_sum

__all__ = ["CompiledSpatialGating", "CudaSpatialGating", "FastSpatialGating"]


class FastSpatialGating(SpatialGating):
    """``SpatialGating`` on token-major arrays (see the module docstring)."""

    norm = FastLayerNorm        # the LayerNorm of z2: its ``normalize`` and ``layer_norm_backward``
    product = staticmethod(np.matmul)

    @staticmethod
    def split_gate(f, gamma, shift, residual, z1, out):
        """The split variant's F = f gamma + shift (+ residual), written into f, and out = z1 * F
        in one pass; returns the copy of z1 that backward needs, or None where this back end has
        no kernel for the arrays (the array code of ``forward`` runs)."""
        return None

    @staticmethod
    def split_gate_backward(g, F, kept, dz1, gf):
        """dL/dz1 = G F into ``dz1`` and G_F = G z1 in one pass: ``(G_F, the gate bias's gradient
        or None)``, or None where this back end has no kernel for the arrays."""
        return None

    @staticmethod
    def affine(x, w, b):
        """N = x w + b over the last axis in one pass, or None (no kernel)."""
        return None

    @classmethod
    def forward(cls, ctx, z, weight, bias, norm_weight, norm_bias, gate_residual=None, *,
                eps=1e-5, causal=False, variant="split"):
        xp = array_module(z)
        gamma, beta = norm_weight, norm_bias
        token_major = token_major_view(z).flags.c_contiguous
        zt = token_major_view(z)                                    # (S, B, 2e or e)
        S, B, _ = zt.shape
        e = z.shape[-1] // 2 if variant == "split" else z.shape[-1]
        ut = zt[..., e:] if variant == "split" else zt
        w_eff = xp.tril(weight) if causal else weight

        xhat, rstd = cls.norm.normalize(ut, eps)                    # (S, B, e)
        f = cls.product(w_eff, xhat.reshape(S, -1)).reshape(S, B, e)   # W x_hat: one product
        shift = row_sum(w_eff)[:, None] * beta + bias[:, None]      # (S, e), shared by the batch
        residual = token_major_view(gate_residual) if gate_residual is not None else None
        out = empty_token_major((B, S, e), token_major, xp, z.dtype)
        out_t = token_major_view(out)
        kept = cls.split_gate(f, gamma, shift, residual, zt[..., :e], out_t) if variant == "split" else None
        if kept is None:                                            # no kernel: step by step
            if variant == "split":
                kept = xp.ascontiguousarray(zt[..., :e])            # z2's memory may go, z1 stays
            elif variant == "multiplicative":
                kept = zt
            f *= gamma
            f += shift[:, None]
            if residual is not None:
                f += residual
            if variant in ("split", "multiplicative"):
                xp.multiply(kept, f, out=out_t)
            elif variant == "additive":
                xp.add(zt, f, out=out_t)
            else:
                out_t[...] = f
        ctx.variant, ctx.causal, ctx.e, ctx.token_major = variant, causal, e, token_major
        keep_f = variant in ("split", "multiplicative")
        ctx.save_for_backward(kept, w_eff, gamma, beta, xhat, rstd, f if keep_f else None)
        return out

    @classmethod
    def backward(cls, ctx, g):
        kt, w_eff, gamma, beta, xhat, rstd, ft = take_saved(ctx)
        need_z, need_w, need_b, need_gamma, need_beta, need_a = ctx.needs_input_grad
        xp = array_module(g)
        variant, e = ctx.variant, ctx.e
        last = last_backward(ctx)       # the saved arrays may then serve as buffers
        gt = token_major_view(g)
        S = xhat.shape[0]

        # dL/dF (token-major, contiguous) and the direct term, written straight into dL/dz
        dz = empty_token_major(ctx.input_shapes[0], ctx.token_major, xp, g.dtype) if need_z else None
        dzt = token_major_view(dz) if need_z else None
        sums = None                                                 # the gate bias's gradient, if a kernel summed it
        done = cls.split_gate_backward(gt, ft, kt, dzt[..., :e] if need_z else None, ft if last else None) \
            if variant == "split" else None
        if done is not None:
            gf, sums = done
        elif variant == "split":
            if need_z:
                xp.multiply(gt, ft, out=dzt[..., :e])               # dL/dz1 = G * F
            gf = xp.multiply(gt, kt, out=ft if last else xp.empty_like(xhat))
        elif variant == "multiplicative":
            gf = xp.multiply(gt, kt, out=xp.empty_like(xhat))
        else:
            gf = xp.ascontiguousarray(gt)
        gf2 = gf.reshape(S, -1)                                     # G_F as an (S, B*e) matrix

        dw = db = work = None
        if need_w:
            work = cls.affine(xhat, gamma, beta)
            if work is None:
                work = xhat * gamma
                work += beta                                        # N, rebuilt
            dw = cls.product(gf2, work.reshape(S, -1).T)            # G_F N^T
            if ctx.causal:
                dw = xp.tril(dw)
        if need_b:
            db = sums if sums is not None else row_sum(gf2)
        da = token_major_view(gf) if need_a else None

        dgamma = dbeta = None
        if need_z or need_gamma or need_beta:
            if work is None:
                work = xp.empty_like(xhat)
            gn = cls.product(w_eff.T, gf2, out=work.reshape(S, -1)).reshape(xhat.shape)   # W^T G_F
            du = (dzt[..., e:] if variant == "split" else dzt) if need_z else None
            du, dgamma, dbeta = cls.norm.layer_norm_backward(
                gn, xhat, rstd, gamma, out=du, need_dx=need_z, need_dweight=need_gamma, need_dbias=need_beta,
                overwrite_g=True, overwrite_xhat=last)
            if variant == "multiplicative" and need_z:
                dzt += gt * ft
            elif variant == "additive" and need_z:
                dzt += gt
        return dz, dw, db, dgamma, dbeta, da


class CompiledSpatialGating(FastSpatialGating):
    """``SpatialGating`` with the split gate, the LayerNorm and N compiled (numba), where they apply.

    The split variant on token-major z (the models' layout) saves less and writes less: z itself
    (its halves are z1 and the LayerNorm's input), the rows' mean and 1/std, and W x_hat as the
    product left it. x_hat is a temporary of the forward pass; backward's gate pass reads each row
    of z once, for G * z1 and for N rebuilt from z2, the LayerNorm backward reads z2, and
    F = (W x_hat) gamma + shift is recomputed where the gate reads it (with aMLP's residual, F is
    written over W x_hat instead: the residual is not kept). Forward writes one (S, B, e) array
    fewer than the generic path (no copy of z1), two fewer without a residual (F not written
    either), and saves as much.
    """

    norm = CompiledLayerNorm
    split_gate = staticmethod(gating_numba.gate_forward)
    split_gate_backward = staticmethod(gating_numba.gate_backward)
    affine = staticmethod(gating_numba.affine)

    @staticmethod
    def takes_bias(index, x, bias, kwargs):
        """The gate residual's pending bias (aMLP's attention output projection's): added to
        ``shift`` below, (S, e) numbers, instead of to the (B, S, e) residual."""
        return "residual_bias" if index == 5 and compiled.applies(x, bias) else None

    @classmethod
    def forward(cls, ctx, z, weight, bias, norm_weight, norm_bias, gate_residual=None, *,
                eps=1e-5, causal=False, variant="split", residual_bias=None):
        zt = token_major_view(z)
        inputs = [a for a in (z, weight, bias, norm_weight, norm_bias, gate_residual) if a is not None]
        ctx.saves_z = variant == "split" and zt.flags.c_contiguous and z.size > 0 and compiled.applies(*inputs)
        if ctx.saves_z:
            done = gating_numba.gate_forward_from_z(zt, np.tril(weight) if causal else weight, bias, norm_weight,
                                                    norm_bias, gate_residual, residual_bias, eps)
            if done is not None:
                out, saved, ctx.raw = done
                ctx.causal = causal
                ctx.save_for_backward(zt, *saved)
                return out
            ctx.saves_z = False                                      # the kernels failed: the generic path
        if residual_bias is not None:
            gate_residual = gate_residual + residual_bias            # a new array: the caller's is not written
        return super().forward(ctx, z, weight, bias, norm_weight, norm_bias, gate_residual, eps=eps,
                               causal=causal, variant=variant)

    @classmethod
    def backward(cls, ctx, g):
        if not ctx.saves_z:
            return super().backward(ctx, g)
        zt, w_eff, gamma, beta, shift, mean, rstd, f = take_saved(ctx)
        S, B, e = f.shape
        z2 = zt[..., e:]
        need_z, need_w, need_b, need_gamma, need_beta, need_a = ctx.needs_input_grad
        gt = token_major_view(g)
        if gating_numba.token_rows(gt) is None or gt.dtype != f.dtype:
            gt = np.ascontiguousarray(gt, dtype=f.dtype)
        dz = empty_token_major(ctx.input_shapes[0], True, np, f.dtype) if need_z else None
        dzt = token_major_view(dz) if need_z else None
        last = last_backward(ctx)
        done = gating_numba.gate_backward_from_z(gt, f, zt, dzt[..., :e] if need_z else None,
                                                 f if last else None, gamma, shift, beta, mean, rstd,
                                                 raw=ctx.raw, need_n=need_w)   # and N, rebuilt from z2
        if done is None:          # the kernels switched off since forward, or failed: the generic path
            xhat = (z2 - mean.reshape(S, B, 1)) * rstd.reshape(S, B, 1)
            F = f * gamma + shift[:, None] if ctx.raw else f
            ctx.variant, ctx.e, ctx.token_major = "split", e, True
            ctx.save_for_backward(zt[..., :e], w_eff, gamma, beta, xhat, rstd.reshape(S, B, 1), F)
            return super().backward(ctx, g)
        gf, db, work = done
        gf2 = gf.reshape(S, -1)                                      # G_F as an (S, B*e) matrix
        dw = None
        if need_w:
            dw = gf2 @ work.reshape(S, -1).T                         # G_F N^T
            if ctx.causal:
                dw = np.tril(dw)
        dgamma = dbeta = None
        if need_z or need_gamma or need_beta:
            work = np.empty_like(f) if work is None else work
            gn = np.matmul(w_eff.T, gf2, out=work.reshape(S, -1))  # W^T G_F
            du = dzt[..., e:].reshape(S * B, e) if need_z else None
            _, dgamma, dbeta = backward_rows(gn.reshape(S * B, e), z2.reshape(S * B, e), mean, rstd, gamma, need_z,
                                             out=du)
        return (dz, dw, db if need_b else None, dgamma if need_gamma else None, dbeta if need_beta else None,
                token_major_view(gf) if need_a else None)


class CudaSpatialGating(FastSpatialGating):
    """``SpatialGating`` on CUDA: the LayerNorm one kernel per row, the split gate one pass each way."""

    norm = CudaLayerNorm
    product = staticmethod(cublas.product)

    @staticmethod
    def split_gate(f, gamma, shift, residual, z1, out):
        if not cuda.applies(z1):
            return None
        kept = array_module(z1).ascontiguousarray(z1)               # z2's memory may go, z1 stays
        gating_cuda.sgu_gate_forward(f, gamma, shift[:, None], kept, residual, out=out)
        return kept

    @staticmethod
    def split_gate_backward(g, F, kept, dz1, gf):
        if dz1 is None or not cuda.applies(g, kept):
            return None
        _, gf = gating_cuda.sgu_gate_backward(g, F, kept, dz1=dz1)
        return gf, None

