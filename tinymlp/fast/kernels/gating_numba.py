"""The spatial gating unit's split gate on the CPU, compiled by numba.

Forward: F = (W x_hat) gamma + shift (+ the aMLP residual), the copy of z1 and z1 * F in one
pass; backward: G * F, G * z1 and the gate bias's row sums in one; and the rebuilt
N = x_hat gamma + beta in one. The fast tier's ``CompiledSpatialGating`` (fast/gating.py) calls
``gate_forward``, ``gate_backward`` and ``affine``; each returns None where the arrays do not
suit a kernel (rows of width e with unit stride, one float dtype), and the NumPy code runs.
Arrays are token-major (S, B, e) views: F and the copy of z1 contiguous, the others in any
order of their first two axes. The formulas are derived in ops/gating.py.
"""

from __future__ import annotations

import numpy as np

from .. import compiled
from ..compiled import prange

__all__ = ["affine", "gate_backward", "gate_forward", "token_rows"]


# The SGU's gate (split variant) on rows of width e, token-major: row i is token s = i // B of
# sample b = i % B; an array's row (s, b) starts at s * (its token stride) + b * (its sample stride).
def _gate_forward(f, z1, zss, zbs, r, rss, rbs, has_r, kept, out, oss, obs, gamma, shift, n, e, B):
    # F = f gamma + shift_s (+ r); f <- F (saved for backward); kept <- z1; out <- z1 F
    for i in prange(n):
        s = i // B
        b = i - s * B
        fr = f[i * e:i * e + e]
        zo = s * zss + b * zbs
        zr = z1[zo:zo + e]
        kr = kept[i * e:i * e + e]
        oo = s * oss + b * obs
        orow = out[oo:oo + e]
        sh = shift[s]
        if has_r:
            ro = s * rss + b * rbs
            rr = r[ro:ro + e]
            for j in range(e):
                F = fr[j] * gamma[j] + sh[j] + rr[j]
                fr[j] = F
                k = zr[j]
                kr[j] = k
                orow[j] = k * F
        else:
            for j in range(e):
                F = fr[j] * gamma[j] + sh[j]
                fr[j] = F
                k = zr[j]
                kr[j] = k
                orow[j] = k * F


def _gate_backward(g, gss, gbs, F, kept, dz1, dss, dbs, need_dz1, gf, sums, n, e, B):
    # dz1 <- G F;  gf <- G z1 (dL/dF; may be F's own memory);  sums[i] <- the row's sum of gf
    for i in prange(n):
        s = i // B
        b = i - s * B
        go = s * gss + b * gbs
        gr = g[go:go + e]
        fr = F[i * e:i * e + e]
        kr = kept[i * e:i * e + e]
        out = gf[i * e:i * e + e]
        acc = 0.0
        if need_dz1:
            do = s * dss + b * dbs
            dr = dz1[do:do + e]
            for j in range(e):
                gj = gr[j]
                dr[j] = gj * fr[j]
                v = gj * kr[j]
                out[j] = v
                acc += v
        else:
            for j in range(e):
                v = gr[j] * kr[j]
                out[j] = v
                acc += v
        sums[i] = acc


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


def gate_forward(f, gamma, shift, residual, z1, out):
    """F = f gamma + shift (+ residual) into f, and z1 * F into ``out``, in one pass; returns
    the contiguous copy of z1 that backward needs."""
    arrays = [f, gamma, shift, z1, out] + ([residual] if residual is not None else [])
    if not compiled.applies(*arrays) or not f.flags.c_contiguous or not f.size:
        return None
    S, B, e = f.shape
    views = [token_rows(a) for a in (z1, out, residual if residual is not None else f)]
    if any(v is None for v in views):
        return None
    (zf, zss, zbs), (of, oss, obs), (rf, rss, rbs) = views
    kept = np.empty((S, B, e), dtype=f.dtype)
    compiled.kernel(GATE_FORWARD, f.size)(f.reshape(-1), zf, zss, zbs, rf, rss, rbs, residual is not None,
                                          kept.reshape(-1), of, oss, obs, np.ascontiguousarray(gamma),
                                          np.ascontiguousarray(shift), S * B, e, B)
    return kept


def gate_backward(g, F, kept, dz1, gf):
    """dz1 = G F (when ``dz1`` is given) and G * z1 into ``gf`` (a new array when None), in one
    pass; returns ``(gf, per-token sums of gf)`` (the gate bias's gradient)."""
    arrays = [g, F, kept] + [a for a in (dz1, gf) if a is not None]
    if not compiled.applies(*arrays) or not (F.flags.c_contiguous and kept.flags.c_contiguous) or not F.size:
        return None
    if gf is not None and not gf.flags.c_contiguous:
        return None
    S, B, e = F.shape
    gr = token_rows(g)
    dr = token_rows(dz1) if dz1 is not None else (F.reshape(-1), 0, 0)
    if gr is None or dr is None:
        return None
    gf = np.empty_like(F) if gf is None else gf
    sums = np.empty(S * B)
    compiled.kernel(GATE_BACKWARD, F.size)(gr[0], gr[1], gr[2], F.reshape(-1), kept.reshape(-1), dr[0], dr[1], dr[2],
                                           dz1 is not None, gf.reshape(-1), sums, S * B, e, B)
    return gf, sums.reshape(S, B).sum(axis=1).astype(F.dtype)


def affine(x, w, b):
    """x * w + b over the last axis of a C-contiguous x, in one pass (None where it does not apply)."""
    if not compiled.applies(x, w, b) or not x.flags.c_contiguous or not x.size:
        return None
    e = x.shape[-1]
    out = np.empty_like(x)
    compiled.kernel(AFFINE, x.size)(x.reshape(-1), np.ascontiguousarray(w), np.ascontiguousarray(b), out.reshape(-1),
                                    x.size // e, e)
    return out
