"""LayerNorm on the CPU, compiled by numba: one pass over the rows forward, one backward.

Forward computes each row's mean and 1/std and writes y; backward computes dx row by row and
the column sums of G x_hat (dweight) and G (dbias) as per-block partial sums, added at the end.
Sums run in the arrays' dtype, where they vectorise (float64 sums made float32 kernels 20-35%
slower): a row's sums over its D values, and the column sums over runs of ``RUN`` rows, each run
then added into float64 partials. A float32 row whose sum or sum of squares overflows (|x - mean|
beyond 1.8e19) is summed again in float64, so huge rows normalise as the reference's do.

The fast tier's ``CompiledLayerNorm`` (fast/norm.py) saves x, the row means and 1/std (no x_hat
is written: backward recomputes x_hat = (x - mean) / std on the fly); the SGU's LayerNorm uses
``normalize`` and ``layer_norm_backward``, with x_hat saved. The formulas are derived in
ops/norm.py.

The kernels take each matrix as a flat C-contiguous buffer and a row stride (in elements):
rows may be spaced wider than they are long (the SGU's z2 half of each row of z), and numba
vectorises only loops over arrays it knows to be contiguous.
"""

from __future__ import annotations

import numpy as np

from .. import compiled
from ..compiled import prange
from ..layout import inverse, memory_order

__all__ = ["backward_rows", "forward_rows", "layer_norm_backward", "normalize", "row_matrix"]


RUN = 16
"""Rows whose column sums (dweight, dbias) backward adds in the arrays' dtype before adding them
into the float64 partials."""


def _ln_forward(x, xs, n, dim, w, b, eps, size, y, ys, mean, rstd):
    # rows of x (N, D): mean, 1/std, y = (x - mean)/std * w + b; sums in x's dtype (``size`` is D
    # in it), again in float64 for a row where they overflow
    zero = size - size
    for i in prange(n):
        xr = x[i * xs:i * xs + dim]      # a contiguous slice: the loops below vectorise
        yr = y[i * ys:i * ys + dim]
        s = zero
        for j in range(dim):
            s += xr[j]
        mu = s / size
        ss = zero
        for j in range(dim):
            c = xr[j] - mu
            ss += c * c
        if not (abs(s) < np.inf and ss < np.inf):     # float32 overflowed (or NaN: it stays NaN)
            s64 = 0.0
            for j in range(dim):
                s64 += xr[j]
            mu64 = s64 / dim
            ss64 = 0.0
            for j in range(dim):
                c64 = xr[j] - mu64
                ss64 += c64 * c64
            mean[i] = mu64
            rstd[i] = 1.0 / np.sqrt(ss64 / dim + eps)
        else:
            mean[i] = mu
            rstd[i] = np.float32(1) / np.sqrt(ss / size + eps)
        mu_t = mean[i]       # read back: in x's dtype, so the loop below stays in it
        r_t = rstd[i]
        for j in range(dim):
            yr[j] = (xr[j] - mu_t) * r_t * w[j] + b[j]


def _ln_backward(g, gs, x, xs, n, dim, mean, scale, rstd, w, size, dx, ds, need_dx, dw_part, db_part, run_sums):
    # x_hat = (x - mean) scale; G_hat = G w; dx = rstd (G_hat - mean(G_hat) - x_hat mean(G_hat x_hat));
    # column sums of G x_hat (dw) and G (db) per block of rows: over runs of RUN rows in x's dtype
    # (``run_sums[p]``; ``size`` is D in it), each run added into the float64 partials
    blocks = dw_part.shape[0]
    zero = size - size
    for p in prange(blocks):
        lo = p * n // blocks
        hi = (p + 1) * n // blocks
        dwp = dw_part[p]
        dbp = db_part[p]
        dwr = run_sums[p, 0]
        dbr = run_sums[p, 1]
        for i in range(lo, hi):
            if (i - lo) % RUN == 0:
                for j in range(dim):
                    dwr[j] = zero
                    dbr[j] = zero
            gr = g[i * gs:i * gs + dim]
            xr = x[i * xs:i * xs + dim]
            mu = mean[i]
            sc = scale[i]
            a = zero
            c = zero
            for j in range(dim):
                xh = (xr[j] - mu) * sc
                gj = gr[j]
                dwr[j] += gj * xh
                dbr[j] += gj
                gh = gj * w[j]
                a += gh
                c += gh * xh
            if (i - lo) % RUN == RUN - 1 or i == hi - 1:
                for j in range(dim):
                    dwp[j] += dwr[j]
                    dbp[j] += dbr[j]
            if need_dx:
                dr = dx[i * ds:i * ds + dim]
                a_t = a / size
                c_t = c / size
                r_t = rstd[i]
                for j in range(dim):
                    gh = gr[j] * w[j]          # rounded as above: exact cancellations stay exact
                    xh = (xr[j] - mu) * sc
                    dr[j] = r_t * ((gh - a_t) - xh * c_t)


LN_FORWARD = compiled.jit(_ln_forward, reduce=True)
LN_BACKWARD = compiled.jit(_ln_backward, reduce=True)


def row_matrix(x):
    """``(X (N, D) view with contiguous rows, order)`` of x read in its memory order with the
    last axis last, or (None, None) when that needs a copy."""
    order = memory_order(x)
    last = x.ndim - 1
    if order[-1] != last:
        order = tuple(i for i in order if i != last) + (last,)
    xt = x.transpose(order)
    if x.shape[-1] > 1 and xt.strides[-1] != x.itemsize:
        return None, None
    try:
        X = np.reshape(xt, (-1, x.shape[-1]), copy=False)
    except (ValueError, TypeError):
        return None, None
    return X, order


def _flat_rows(X):
    """``(flat, row_stride)``: X (N, D), whose rows are contiguous, as a flat contiguous view
    from its first element to its last, and the distance between its rows (in elements)."""
    n, dim = X.shape
    if X.flags.c_contiguous:
        return X.reshape(-1), dim
    rs = X.strides[0] // X.itemsize
    flat = np.lib.stride_tricks.as_strided(X, shape=((n - 1) * rs + dim,), strides=(X.itemsize,))
    return flat, rs


def _param(v, dim, dtype, fill):
    return np.full(dim, fill, dtype=dtype) if v is None else np.ascontiguousarray(v, dtype=dtype)


def forward_rows(X, w, b, eps):
    """Y, mean, rstd of the rows of X (N, D); None where the kernel failed (``compiled.KernelFailed``)."""
    n, dim = X.shape
    Y = np.empty((n, dim), dtype=X.dtype)
    mean = np.empty(n, dtype=X.dtype)
    rstd = np.empty(n, dtype=X.dtype)
    xf, xs = _flat_rows(X)
    t = X.dtype.type
    try:
        compiled.kernel(LN_FORWARD, X.size)(xf, xs, n, dim, _param(w, dim, X.dtype, 1), _param(b, dim, X.dtype, 0),
                                            t(eps), t(dim), Y.reshape(-1), dim, mean, rstd)
    except compiled.KernelFailed:
        return None
    return Y, mean, rstd


def backward_rows(G, X, mean, scale, rstd, w, need_dx, out=None):
    """dX (into ``out`` when given), dw, db (column sums over runs of ``RUN`` rows, added in
    float64, cast) for rows (N, D); None where the kernel failed (``compiled.KernelFailed``)."""
    n, dim = G.shape
    blocks = max(1, min(n, 4 * compiled.threads())) if G.size >= compiled.PARALLEL_MIN else 1
    dw_part = np.zeros((blocks, dim))
    db_part = np.zeros((blocks, dim))
    dX = ((out if out is not None else np.empty((n, dim), dtype=G.dtype)) if need_dx
          else np.empty((1, dim), dtype=G.dtype))
    run_sums = np.empty((blocks, 2, dim), dtype=G.dtype)
    (gf, gs), (xf, xs), (df, ds) = _flat_rows(G), _flat_rows(X), _flat_rows(dX)
    try:
        compiled.kernel(LN_BACKWARD, G.size)(gf, gs, xf, xs, n, dim, mean, scale, rstd, _param(w, dim, G.dtype, 1),
                                             G.dtype.type(dim), df, ds, need_dx, dw_part, db_part, run_sums)
    except compiled.KernelFailed:
        return None
    return (dX if need_dx else None), dw_part.sum(0).astype(G.dtype), db_part.sum(0).astype(G.dtype)


def normalize(x, eps):
    """``(x_hat, rstd)`` as ``fast.norm.normalize``, in one compiled pass over the rows; None
    where the kernel does not take x or failed."""
    X, order = row_matrix(x) if compiled.applies(x) and x.size else (None, None)
    if X is None:
        return None
    done = forward_rows(X, None, None, eps)
    if done is None:
        return None
    xhat, _, rstd = done
    shape_t = tuple(x.shape[i] for i in order)
    back = inverse(order)
    r = rstd.reshape(shape_t[:-1] + (1,)).transpose(back)
    return xhat.reshape(shape_t).transpose(back), r


def layer_norm_backward(g, xhat, rstd, weight, out, need_dx, need_dweight, need_dbias):
    """``(dx, dweight, dbias)`` as ``fast.norm.layer_norm_backward``, in one compiled pass over the
    rows (dx into ``out`` when given); None where the kernel does not take the arrays or failed."""
    arrays = [a for a in (g, xhat, rstd, weight, out) if a is not None]
    if not compiled.applies(*arrays) or not xhat.size:
        return None
    Xh, order = row_matrix(xhat)
    if Xh is None or rstd.shape != xhat.shape[:-1] + (1,):
        return None
    out_rows = None
    if out is not None and need_dx:
        out_rows, out_order = row_matrix(out)
        if out_rows is None or out_order != order:
            return None
    G = np.ascontiguousarray(np.broadcast_to(g, xhat.shape).transpose(order)).reshape(Xh.shape)
    r = np.ascontiguousarray(rstd[..., 0].transpose(order[:-1])).reshape(-1)
    n = Xh.shape[0]
    done = backward_rows(G, Xh, np.zeros(n, Xh.dtype), np.ones(n, Xh.dtype), r, weight, need_dx, out=out_rows)
    if done is None:
        return None
    dX, dw, db = done
    dx = None
    if need_dx:
        dx = out if out is not None else dX.reshape(tuple(xhat.shape[i] for i in order)).transpose(inverse(order))
    return dx, (dw if need_dweight else None), (db if need_dbias else None)
