"""The spatial gating unit's split gate on the CPU, compiled by numba.

Forward: out = z1 * F with F = (W x_hat) gamma + shift (+ the aMLP residual) in one pass, F
written over W x_hat only where backward cannot recompute it (the residual case), z1 copied only
where asked; backward: G * F, G * z1 and the gate bias's row sums in one pass, F read or
recomputed from W x_hat; and N = (x - mean) rstd gamma + beta, rebuilt from the LayerNorm's
input and its row statistics, in one. The fast tier's ``CompiledSpatialGating``
(fast/gating.py) calls ``gate_forward_from_z`` and ``gate_backward_from_z`` on the models'
token-major z, and ``gate_forward``, ``gate_backward`` and ``affine`` on other layouts; each
returns None where the arrays do not suit a kernel (rows of width e with unit stride, one float
dtype) or a kernel failed (``compiled.KernelFailed``), and the NumPy code runs. Arrays are
token-major (S, B, e) views, in any order of their first two axes. The formulas are derived in
ops/gating.py.
"""

from __future__ import annotations

import numpy as np

from .. import compiled
from ..compiled import prange
from ..layout import token_major_view
from . import norm_numba

__all__ = ["affine", "gate_backward", "gate_backward_from_z", "gate_forward", "gate_forward_from_z", "token_rows"]


# The SGU's gate (split variant) on rows of width e, token-major: row i is token s = i // B of
# sample b = i % B; an array's row (s, b) starts at s * (its token stride) + b * (its sample stride).
def _gate_forward(f, fss, fbs, write_f, z1, zss, zbs, r, rss, rbs, has_r, kept, copy_z1, out, oss, obs,
                  gamma, shift, n, e, B):
    # F = f gamma + shift_s (+ r); out <- z1 F; f <- F where write_f or r; kept <- z1 where copy_z1
    for i in prange(n):
        s = i // B
        b = i - s * B
        fo = s * fss + b * fbs
        fr = f[fo:fo + e]
        zo = s * zss + b * zbs
        zr = z1[zo:zo + e]
        oo = s * oss + b * obs
        orow = out[oo:oo + e]
        sh = shift[s]
        if has_r:                       # F always written: backward could not recompute it
            ro = s * rss + b * rbs
            rr = r[ro:ro + e]
            for j in range(e):
                F = fr[j] * gamma[j] + sh[j] + rr[j]
                fr[j] = F
                orow[j] = zr[j] * F
        elif write_f:
            for j in range(e):
                F = fr[j] * gamma[j] + sh[j]
                fr[j] = F
                orow[j] = zr[j] * F
        else:
            for j in range(e):
                orow[j] = zr[j] * (fr[j] * gamma[j] + sh[j])
        if copy_z1:
            kr = kept[i * e:i * e + e]
            for j in range(e):
                kr[j] = zr[j]


def _gate_backward(g, gss, gbs, F, raw, gamma, shift, z1, zss, zbs, dz1, dss, dbs, need_dz1, gf, sums,
                   x2, xss, xbs, mean, scale, beta, nout, need_n, n, e, B):
    # F, or, where raw, F = f gamma + shift_s recomputed from f = W x_hat; dz1 <- G F; gf <- G z1
    # (dL/dF; may be F's own memory); sums[i] <- the row's sum of gf; where need_n, nout <- N =
    # (x2 - mean) scale gamma + beta, from the LayerNorm's input x2 (z's other half: each row of z
    # is read once)
    for i in prange(n):
        s = i // B
        b = i - s * B
        go = s * gss + b * gbs
        gr = g[go:go + e]
        fr = F[i * e:i * e + e]
        zo = s * zss + b * zbs
        zr = z1[zo:zo + e]
        out = gf[i * e:i * e + e]
        sh = shift[s]
        acc = 0.0
        if need_dz1:
            do = s * dss + b * dbs
            dr = dz1[do:do + e]
            if raw:
                for j in range(e):
                    gj = gr[j]
                    dr[j] = gj * (fr[j] * gamma[j] + sh[j])
                    v = gj * zr[j]
                    out[j] = v
                    acc += v
            else:
                for j in range(e):
                    gj = gr[j]
                    dr[j] = gj * fr[j]
                    v = gj * zr[j]
                    out[j] = v
                    acc += v
        else:
            for j in range(e):
                v = gr[j] * zr[j]
                out[j] = v
                acc += v
        sums[i] = acc
        if need_n:
            xo = s * xss + b * xbs
            xr = x2[xo:xo + e]
            nr = nout[i * e:i * e + e]
            mu = mean[i]
            sc = scale[i]
            for j in range(e):
                nr[j] = (xr[j] - mu) * sc * gamma[j] + beta[j]


def _affine(x, w, b, out, n, e):
    # out = x w + b on rows of width e (the SGU's N = x_hat gamma + beta, rebuilt)
    for i in prange(n):
        xr = x[i * e:i * e + e]
        orow = out[i * e:i * e + e]
        for j in range(e):
            orow[j] = xr[j] * w[j] + b[j]


GATE_FORWARD = compiled.jit(_gate_forward)
GATE_BACKWARD = compiled.jit(_gate_backward, reduce=True)
AFFINE = compiled.jit(_affine)


def token_rows(a):
    """``(flat, token stride, sample stride)`` (in elements) of an (S, B, e) view whose rows (the
    last axis) are contiguous, or None: ``flat`` runs from its first element to its last."""
    S, B, e = a.shape
    item = a.itemsize
    if (e > 1 and a.strides[-1] != item) or min(a.strides) < 0 or any(st % item for st in a.strides):
        return None
    ss, bs = a.strides[0] // item, a.strides[1] // item
    extent = (S - 1) * ss + (B - 1) * bs + e
    return np.lib.stride_tricks.as_strided(a, shape=(extent,), strides=(item,)), ss, bs


def gate_forward(f, gamma, shift, residual, z1, out, write_f=True, copy_z1=True):
    """out = z1 * F with F = f gamma + shift (+ residual), in one pass; F written into f where
    ``write_f`` or there is a residual. Returns the contiguous copy of z1 where ``copy_z1`` (else True), or None where
    the kernel does not take the arrays."""
    arrays = [f, gamma, shift, z1, out] + ([residual] if residual is not None else [])
    if not compiled.applies(*arrays) or not f.size:
        return None
    S, B, e = f.shape
    views = [token_rows(a) for a in (f, z1, out, residual if residual is not None else f)]
    if any(v is None for v in views):
        return None
    (ff, fss, fbs), (zf, zss, zbs), (of, oss, obs), (rf, rss, rbs) = views
    kept = np.empty((S, B, e) if copy_z1 else (1,), dtype=f.dtype)
    try:
        compiled.kernel(GATE_FORWARD, f.size)(ff, fss, fbs, write_f, zf, zss, zbs, rf, rss, rbs, residual is not None,
                                              kept.reshape(-1), copy_z1, of, oss, obs, np.ascontiguousarray(gamma),
                                              np.ascontiguousarray(shift), S * B, e, B)
    except compiled.KernelFailed:
        return None
    return kept if copy_z1 else True


def gate_forward_from_z(zt, w_eff, bias, gamma, beta, residual, residual_bias, eps):
    """The compiled split gate's forward on token-major z (``zt``, (S, B, 2e), C-contiguous):
    z2's LayerNorm rows (``norm_numba.forward_rows``), W x_hat as one product, then
    ``gate_forward`` without a copy of z1, F written only with a residual (backward recomputes it
    otherwise). Returns ``(out, (w_eff, gamma, beta, shift, mean, rstd, f), raw)`` (what backward
    reads besides z; ``raw``: f is W x_hat, not F), or None where a kernel failed."""
    S, B, width = zt.shape
    e = width // 2
    done = norm_numba.forward_rows(zt[..., e:].reshape(S * B, e), None, None, eps)
    if done is None:
        return None
    xhat, mean, rstd = done
    f = (w_eff @ xhat.reshape(S, -1)).reshape(S, B, e)              # W x_hat: one product
    del xhat, done
    shift = np.einsum("st->s", w_eff)[:, None] * beta + bias[:, None]   # (W 1) beta^T + bias, per token
    if residual_bias is not None:
        shift = shift + residual_bias                               # the residual's bias, per (token, feature)
    r = token_major_view(residual) if residual is not None else None
    if r is not None and token_rows(r) is None:
        r = np.ascontiguousarray(r)                                 # rows with unit stride, for the kernel
    out = np.empty((S, B, e), dtype=zt.dtype)                       # token-major, like z
    if gate_forward(f, gamma, shift, r, zt[..., :e], out, write_f=r is not None, copy_z1=False) is None:
        return None
    return token_major_view(out), (w_eff, gamma, beta, shift, mean, rstd, f), r is None


def _gate_backward_run(g, F, z1, dz1, gf, gamma, shift, raw, x2, mean, rstd, beta, need_n):
    """Launch ``_gate_backward``: ``(gf, per-token sums of gf, N or None)``, or None where the
    arrays do not suit it or it failed (then it wrote nothing)."""
    arrays = [g, F, z1, gamma, shift, x2, mean, rstd, beta] + [a for a in (dz1, gf) if a is not None]
    if not compiled.applies(*arrays) or not F.flags.c_contiguous or not F.size:
        return None
    if gf is not None and not gf.flags.c_contiguous:
        return None
    S, B, e = F.shape
    gr, zr, xr = token_rows(g), token_rows(z1), token_rows(x2)
    dr = token_rows(dz1) if dz1 is not None else (F.reshape(-1), 0, 0)
    if gr is None or zr is None or dr is None or xr is None:
        return None
    gf = np.empty_like(F) if gf is None else gf
    N = np.empty_like(F) if need_n else F
    sums = np.empty(S * B)
    flat = [np.ascontiguousarray(v).reshape(-1) for v in (mean, rstd)]
    try:
        compiled.kernel(GATE_BACKWARD, F.size)(gr[0], gr[1], gr[2], F.reshape(-1), raw, np.ascontiguousarray(gamma),
                                               np.ascontiguousarray(shift), zr[0], zr[1], zr[2], dr[0], dr[1], dr[2],
                                               dz1 is not None, gf.reshape(-1), sums, xr[0],
                                               xr[1], xr[2], *flat, np.ascontiguousarray(beta), N.reshape(-1),
                                               need_n, S * B, e, B)
    except compiled.KernelFailed:
        return None
    return gf, sums.reshape(S, B).sum(axis=1).astype(F.dtype), (N if need_n else None)


def gate_backward(g, F, kept, dz1, gf):
    """dz1 = G F (when ``dz1`` is given) and G * z1 into ``gf`` (a new array when None), in one
    pass; ``kept`` is z1 (any token-major view), ``F`` contiguous. Returns ``(gf, per-token sums
    of gf)`` (the gate bias's gradient), or None where the kernel does not take the arrays."""
    S, B, e = F.shape
    one, zeros = np.ones(e, F.dtype), np.zeros(S * B, F.dtype)                      # unread: not raw, no N
    done = _gate_backward_run(g, F, kept, dz1, gf, one, np.zeros((S, e), F.dtype), False, F, zeros, zeros, one,
                              False)
    return None if done is None else done[:2]


def gate_backward_from_z(g, f, z, dz1, gf, gamma, shift, beta, mean, rstd, raw, need_n):
    """The split gate's backward from z itself (token-major (S, B, 2e); z1 and z2 its halves):
    dz1 = G F and G * z1 (into ``gf`` when given) as ``gate_backward``, F read from ``f`` or,
    where ``raw``, recomputed as f gamma + shift; and where ``need_n``, in the same pass over z,
    N = (z2 - mean) rstd gamma + beta (``mean``, ``rstd``: z2's row statistics, token-major).
    Returns ``(gf, per-token sums of gf, N or None)``, or None (the arrays do not suit it)."""
    e = f.shape[-1]
    return _gate_backward_run(g, f, z[..., :e], dz1, gf, gamma, shift, raw, z[..., e:], mean, rstd, beta, need_n)


def affine(x, w, b):
    """x * w + b over the last axis of a C-contiguous x, in one pass (None where it does not apply
    or failed)."""
    if not compiled.applies(x, w, b) or not x.flags.c_contiguous or not x.size:
        return None
    e = x.shape[-1]
    out = np.empty_like(x)
    try:
        compiled.kernel(AFFINE, x.size)(x.reshape(-1), np.ascontiguousarray(w), np.ascontiguousarray(b),
                                        out.reshape(-1), x.size // e, e)
    except compiled.KernelFailed:
        return None
    return out
