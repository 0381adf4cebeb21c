"""Compiled CPU kernels (numba), optional: ``pip install -e ".[fast]"``.

NumPy runs one ufunc at a time, each a pass over memory on one core. The elementwise hot spots
of a training step are chains of such passes: GELU with its derivative (about 15 passes when
written as formulas, 9 in the chunked fast path), LayerNorm forward and backward (row sums, the
centred copy, the scaled copy, ...), the optimizer's update (about ten). Here each is ONE loop
compiled by numba, over all cores (``parallel=True``) for large arrays and on one core below
``PARALLEL_MIN`` elements, in float32 when the arrays are float32:

- ``CompiledGELU`` (GELU, tanh form): y and dy/dx in one pass; backward G * dy/dx in one. In
  float32, tanh is a rational function (Eigen's ``generic_fast_tanh_float``, a few ulp) that
  vectorises, where libm's scalar ``tanhf`` made the kernel slower than NumPy's SIMD ``tanh``;
  float64 keeps libm's tanh;
- ``CompiledLayerNorm``: forward writes y only and saves its *input* with the row means and
  1/std (no x_hat copy is written: backward recomputes x_hat = (x - mean) / std on the fly);
  backward is one pass per row for dx plus per-thread partial column sums for dweight, dbias;
- the SGU's LayerNorm (``fast.norm.normalize`` and ``layer_norm_backward``) through ``KERNELS``;
- the split SGU's gate (``fast.gating``, through its ``KERNELS``): forward F = (W x_hat) gamma +
  shift (+ the aMLP residual), the copy of z1 and z1 * F in one pass; backward G * F, G * z1 and
  the gate bias's row sums in one; the rebuilt N = x_hat gamma + beta in one;
- Adam/AdamW's direction over the flat buffers (``fast.optim``) in one pass, and each
  parameter's update p <- p (1 - lr wd) - step in one.

Everything else stays the NumPy fast path. Each class is registered for the CPU with
``fast.register`` (by ``set_enabled``, at import when numba is there) and subclasses the NumPy
fast implementation, so ``tests/test_fast_contract.py`` checks it against the reference like any
other; where a kernel does not apply (an integer or float16 array, rows that are not contiguous,
the erf form of GELU, an ndarray subclass) the NumPy fast path runs.

Switches: ``TINYMLP_NUMBA=0`` in the environment (read at import), or ``set_enabled(False)``
(registers the NumPy fast path back). Without numba installed nothing here is registered.

Settings it needs (measured, see issue 17): numba's ``workqueue`` threading layer (its OpenMP
layer spins after a kernel and starves OpenBLAS; set unless ``NUMBA_THREADING_LAYER`` is set),
``error_model="numpy"`` (else division compiles to scalar code), and the compile cache: the
first use compiles for about 5 s, later processes load the cache in a fraction of that. The
cache goes to ``TINYMLP_CACHE_DIR``, else ``~/.cache/tinymlp/numba``, else the temporary
folder; if none is writable the kernels compile in every process (``describe()`` says so).
"""

from __future__ import annotations

import math
import os
import tempfile
import threading
import warnings

import numpy as np

from ..ops.activation import C0, C1, GELU
from ..ops.norm import LayerNorm, _check
from . import register
from . import gating as _gating
from . import norm as _norm
from . import optim as _optim
from .activation import FastGELU
from .layout import inverse, memory_order
from .norm import FastLayerNorm

__all__ = ["CompiledGELU", "CompiledLayerNorm", "available", "describe", "is_enabled", "set_enabled",
           "set_threads"]

PARALLEL_MIN = 1 << 18
"""Arrays with fewer elements run the serial kernel: waking the threads costs more than it gains."""

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_state = {"enabled": False, "error": None, "cache": None, "numba": None}


def _off_by_environment():
    return os.environ.get("TINYMLP_NUMBA", "1").strip().lower() in ("0", "false", "no", "off")


def _cache_dir():
    """A writable folder for numba's compile cache, or None."""
    candidates = [os.environ.get("TINYMLP_CACHE_DIR"),
                  os.path.join(os.path.expanduser("~"), ".cache", "tinymlp", "numba"),
                  os.path.join(tempfile.gettempdir(), f"tinymlp-numba-{os.getuid() if hasattr(os, 'getuid') else 0}")]
    for path in candidates:
        if not path:
            continue
        try:
            os.makedirs(path, exist_ok=True)
            probe = os.path.join(path, f".probe-{os.getpid()}")
            with open(probe, "w"):
                pass
            os.remove(probe)
            return path
        except OSError:
            continue
    return None


# --------------------------------------------------------------------------- the kernels
def _build(numba):
    """Compile-on-first-use kernels: ``{name: (serial, parallel)}``."""
    from numba import prange

    cache = _state["cache"] is not None
    options = dict(cache=cache, error_model="numpy", nogil=True, fastmath={"contract"})
    reduce_options = dict(options, fastmath={"reassoc"})   # row sums may vectorise (no fma: exact zeros stay zero)

    def both(fn, **extra):
        return (numba.njit(**options, **extra)(fn), numba.njit(parallel=True, **options, **extra)(fn))

    def tanh32(u):
        # tanh in float32 as a rational function (Eigen's generic_fast_tanh_float: a few ulp),
        # plain arithmetic that vectorises; libm's scalar tanhf would be 8x slower than NumPy
        big = np.float32(7.90531110763549805)      # beyond it tanh is +-1 in float32
        v = min(max(u, -big), big)
        u2 = v * v
        p = u2 * np.float32(-2.76076847742355e-16) + np.float32(2.00018790482477e-13)
        p = u2 * p + np.float32(-8.60467152213735e-11)
        p = u2 * p + np.float32(5.12229709037114e-08)
        p = u2 * p + np.float32(1.48572235717979e-05)
        p = u2 * p + np.float32(6.37261928875436e-04)
        p = u2 * p + np.float32(4.89352455891786e-03)
        q = u2 * np.float32(1.19825839466702e-06) + np.float32(1.18534705686654e-04)
        q = u2 * q + np.float32(2.26843463243900e-03)
        q = u2 * q + np.float32(4.89352518554385e-03)
        t = v * p / q
        one = np.float32(1)
        return one if u >= big else (-one if u <= -big else t)

    tanh32 = numba.njit(inline="always", **options)(tanh32)

    def gelu_tanh32(x, y, d, c0, c1, c3, half, one):
        # y = x h, h = (1 + t)/2, t = tanh(c0 x (1 + c1 x^2)); d = h + y (1 - t) c0 (1 + 3 c1 x^2)
        for i in prange(x.shape[0]):
            xi = x[i]
            x2 = xi * xi
            t = tanh32(c0 * xi * (one + c1 * x2))
            h = half * (one + t)
            yi = xi * h
            y[i] = yi
            d[i] = h + yi * (one - t) * (c0 * (one + c3 * x2))

    def gelu_tanh32_value(x, y, c0, c1, half, one):
        for i in prange(x.shape[0]):
            xi = x[i]
            t = tanh32(c0 * xi * (one + c1 * xi * xi))
            y[i] = xi * (half * (one + t))

    def gelu_tanh(x, y, d, c0, c1, c3, half, one):
        # the same in float64, with libm's tanh (float64 results as exact as the reference's)
        for i in prange(x.shape[0]):
            xi = x[i]
            x2 = xi * xi
            t = np.tanh(c0 * xi * (one + c1 * x2))
            h = half * (one + t)
            yi = xi * h
            y[i] = yi
            d[i] = h + yi * (one - t) * (c0 * (one + c3 * x2))

    def gelu_tanh_value(x, y, c0, c1, half, one):
        for i in prange(x.shape[0]):
            xi = x[i]
            t = np.tanh(c0 * xi * (one + c1 * xi * xi))
            y[i] = xi * (half * (one + t))

    def multiply(a, b, out):
        for i in prange(a.shape[0]):
            out[i] = a[i] * b[i]

    # The LayerNorm kernels take each matrix as a flat C-contiguous buffer and a row stride (in
    # elements): rows may be spaced wider than they are long (the SGU's z2 half of each row of z),
    # and numba vectorises only loops over arrays it knows to be contiguous.
    def ln_forward(x, xs, n, dim, w, b, eps, y, ys, mean, rstd):
        # rows of x (N, D): mean, 1/std, y = (x - mean)/std * w + b; float64 sums
        for i in prange(n):
            xr = x[i * xs:i * xs + dim]      # a contiguous slice: the loops below vectorise
            yr = y[i * ys:i * ys + dim]
            s = 0.0
            for j in range(dim):
                s += xr[j]
            mu = s / dim
            ss = 0.0
            for j in range(dim):
                c = xr[j] - mu
                ss += c * c
            r = 1.0 / math.sqrt(ss / dim + eps)
            mean[i] = mu
            rstd[i] = r
            mu_t = mean[i]       # read back: in x's dtype, so the loop below stays in it
            r_t = rstd[i]
            for j in range(dim):
                yr[j] = (xr[j] - mu_t) * r_t * w[j] + b[j]

    def ln_backward(g, gs, x, xs, n, dim, mean, scale, rstd, w, dx, ds, need_dx, dw_part, db_part, scratch):
        # x_hat = (x - mean) scale; G_hat = G w; dx = rstd (G_hat - mean(G_hat) - x_hat mean(G_hat x_hat));
        # partial column sums of G x_hat (dw) and G (db) per block of rows, in float64
        blocks = dw_part.shape[0]
        for p in prange(blocks):
            lo = p * n // blocks
            hi = (p + 1) * n // blocks
            dwp = dw_part[p]
            dbp = db_part[p]
            for i in range(lo, hi):
                gr = g[i * gs:i * gs + dim]
                xr = x[i * xs:i * xs + dim]
                mu = mean[i]
                sc = scale[i]
                a = 0.0
                c = 0.0
                for j in range(dim):
                    xh = (xr[j] - mu) * sc
                    gj = gr[j]
                    dwp[j] += gj * xh
                    dbp[j] += gj
                    gh = gj * w[j]
                    a += gh
                    c += gh * xh
                if need_dx:
                    dr = dx[i * ds:i * ds + dim]
                    scratch[p, 0] = a / dim       # read back in x's dtype
                    scratch[p, 1] = c / dim
                    a_t = scratch[p, 0]
                    c_t = scratch[p, 1]
                    r_t = rstd[i]
                    for j in range(dim):
                        gh = gr[j] * w[j]          # rounded as above: exact cancellations stay exact
                        xh = (xr[j] - mu) * sc
                        dr[j] = r_t * ((gh - a_t) - xh * c_t)

    def adam(g, m, v, out, b1, one_b1, b2, one_b2, eps_c, step):
        # m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2;  out <- step m / (sqrt(v) + eps sqrt(c2))
        for i in prange(g.shape[0]):
            gi = g[i]
            mi = m[i] * b1 + gi * one_b1
            vi = v[i] * b2 + (gi * gi) * one_b2
            m[i] = mi
            v[i] = vi
            out[i] = mi / (np.sqrt(vi) + eps_c) * step

    def apply_update(p, u, decay):
        for i in prange(p.shape[0]):
            p[i] = p[i] * decay - u[i]

    # The SGU's gate (split variant) on rows of width e, token-major: row i is token s = i // B of
    # sample b = i % B; an array's row (s, b) starts at s * (its token stride) + b * (its sample stride).
    def sgu_gate_forward(f, z1, zss, zbs, r, rss, rbs, has_r, kept, out, oss, obs, gamma, shift, n, e, B):
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

    def sgu_gate_backward(g, gss, gbs, F, kept, dz1, dss, dbs, need_dz1, gf, sums, n, e, B):
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

    def affine(x, w, b, out, n, e):
        # out = x w + b on rows of width e (the SGU's N = x_hat gamma + beta, rebuilt)
        for i in prange(n):
            xr = x[i * e:i * e + e]
            orow = out[i * e:i * e + e]
            for j in range(e):
                orow[j] = xr[j] * w[j] + b[j]

    kernels = {
        "sgu_gate_forward": both(sgu_gate_forward), "affine": both(affine),
        "sgu_gate_backward": (numba.njit(**reduce_options)(sgu_gate_backward),
                              numba.njit(parallel=True, **reduce_options)(sgu_gate_backward)),
        "gelu_tanh": both(gelu_tanh), "gelu_tanh_value": both(gelu_tanh_value), "multiply": both(multiply),
        "gelu_tanh32": both(gelu_tanh32), "gelu_tanh32_value": both(gelu_tanh32_value),
        "adam": both(adam), "apply_update": both(apply_update),
        "ln_forward": (numba.njit(**reduce_options)(ln_forward), numba.njit(parallel=True, **reduce_options)(ln_forward)),
        "ln_backward": (numba.njit(**reduce_options)(ln_backward),
                        numba.njit(parallel=True, **reduce_options)(ln_backward)),
    }
    return kernels


_K = {}
_PARALLEL = threading.Lock()
"""numba's workqueue layer runs one parallel kernel at a time: a second one launched from another
Python thread meanwhile would abort the process, so parallel launches take this lock."""


def _kernel(name, size):
    serial, parallel = _K[name]
    if size < PARALLEL_MIN:
        return serial

    def run(*args):
        with _PARALLEL:
            return parallel(*args)

    return run


def _fail(exc):
    """A kernel that does not compile or run: say so once, fall back to the NumPy fast path."""
    _state["error"] = f"{type(exc).__name__}: {exc}"
    warnings.warn(f"tinymlp: the numba kernels failed ({_state['error']}); using the NumPy fast path",
                  RuntimeWarning, stacklevel=3)
    set_enabled(False)


# --------------------------------------------------------------------------- layouts
def _flat(x):
    """``(flat view, order)`` of x in its memory order, or (None, None) when x is not contiguous
    in any order of its axes."""
    order = memory_order(x)
    xt = x.transpose(order)
    if not xt.flags.c_contiguous:
        return None, None
    return xt.reshape(-1), order


def _row_matrix(x):
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


def _applies(*arrays):
    dtype = arrays[0].dtype
    return _state["enabled"] and all(type(a) is np.ndarray and a.dtype == dtype for a in arrays) and dtype in _FLOATS


def _param(v, dim, dtype, fill):
    return np.full(dim, fill, dtype=dtype) if v is None else np.ascontiguousarray(v, dtype=dtype)


# --------------------------------------------------------------------------- GELU
class CompiledGELU(FastGELU):
    """GELU (tanh form) as one compiled pass writing y and dy/dx; the erf form is FastGELU's."""

    @staticmethod
    def forward(ctx, x, approximate=True):
        if not (approximate and _applies(x) and x.size):
            return FastGELU.forward(ctx, x, approximate)
        xf, order = _flat(x)
        if xf is None:
            x = np.ascontiguousarray(x)
            xf, order = x.reshape(-1), tuple(range(x.ndim))
        t = x.dtype.type
        yt = np.empty(xf.size, dtype=x.dtype)
        want = ctx.needs_input_grad[0]
        name = "gelu_tanh32" if x.dtype == np.float32 else "gelu_tanh"
        try:
            if want:
                d = np.empty(xf.size, dtype=x.dtype)
                _kernel(name, xf.size)(xf, yt, d, t(C0), t(C1), t(3 * C1), t(0.5), t(1))
            else:
                d = None
                _kernel(name + "_value", xf.size)(xf, yt, t(C0), t(C1), t(0.5), t(1))
        except Exception as exc:  # noqa: BLE001 - any compile or run failure: the NumPy path
            _fail(exc)
            return FastGELU.forward(ctx, x, approximate)
        shape_t = tuple(x.shape[i] for i in order)
        back = inverse(order)
        y = yt.reshape(shape_t).transpose(back)
        ctx.save_for_backward(d.reshape(shape_t).transpose(back) if d is not None else None)
        return y

    @staticmethod
    def backward(ctx, grad):
        (dydx,) = ctx.pop_saved()
        df, order = _flat(dydx)
        if not _applies(grad, dydx) or df is None or memory_order(grad) != order or \
                not grad.transpose(order).flags.c_contiguous:
            return grad * dydx if ctx.retain_graph else np.multiply(grad, dydx, out=dydx)
        gf = grad.transpose(order).reshape(-1)
        out = df if not ctx.retain_graph else np.empty_like(df)
        _kernel("multiply", gf.size)(gf, df, out)
        return out.reshape(tuple(dydx.shape[i] for i in order)).transpose(inverse(order))


# --------------------------------------------------------------------------- LayerNorm
def _rows(X):
    """``(flat, row_stride)``: X (N, D), whose rows are contiguous, as a flat contiguous view
    from its first element to its last, and the distance between its rows (in elements)."""
    n, dim = X.shape
    if X.flags.c_contiguous:
        return X.reshape(-1), dim
    rs = X.strides[0] // X.itemsize
    flat = np.lib.stride_tricks.as_strided(X, shape=((n - 1) * rs + dim,), strides=(X.itemsize,))
    return flat, rs


def _ln_forward(X, w, b, eps):
    """Y, mean, rstd of the rows of X (N, D)."""
    n, dim = X.shape
    Y = np.empty((n, dim), dtype=X.dtype)
    mean = np.empty(n, dtype=X.dtype)
    rstd = np.empty(n, dtype=X.dtype)
    xf, xs = _rows(X)
    _kernel("ln_forward", X.size)(xf, xs, n, dim, _param(w, dim, X.dtype, 1), _param(b, dim, X.dtype, 0), float(eps),
                                  Y.reshape(-1), dim, mean, rstd)
    return Y, mean, rstd


def _ln_backward(G, X, mean, scale, rstd, w, need_dx, out=None):
    """dX (into ``out`` when given), dw, db (float64 column sums, cast) for rows (N, D)."""
    n, dim = G.shape
    blocks = max(1, min(n, 4 * _threads())) if G.size >= PARALLEL_MIN else 1
    dw_part = np.zeros((blocks, dim))
    db_part = np.zeros((blocks, dim))
    dX = (out if out is not None else np.empty((n, dim), dtype=G.dtype)) if need_dx else np.empty((1, dim), dtype=G.dtype)
    scratch = np.empty((blocks, 2), dtype=G.dtype)
    (gf, gs), (xf, xs), (df, ds) = _rows(G), _rows(X), _rows(dX)
    _kernel("ln_backward", G.size)(gf, gs, xf, xs, n, dim, mean, scale, rstd, _param(w, dim, G.dtype, 1), df, ds,
                                   need_dx, dw_part, db_part, scratch)
    return (dX if need_dx else None), dw_part.sum(0).astype(G.dtype), db_part.sum(0).astype(G.dtype)


def _threads():
    numba = _state["numba"]
    return numba.get_num_threads() if numba is not None else 1


class CompiledLayerNorm(FastLayerNorm):
    """LayerNorm as one compiled pass over the rows each way; saves x, the row means and 1/std."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps=1e-5):
        _check(x, weight, bias, eps)
        arrays = [a for a in (x, weight, bias) if a is not None]
        X, order = _row_matrix(x) if _applies(*arrays) and x.size else (None, None)
        if X is None:
            ctx.compiled = False
            return FastLayerNorm.forward(ctx, x, weight, bias, eps)
        try:
            Y, mean, rstd = _ln_forward(X, weight, bias, eps)
        except Exception as exc:  # noqa: BLE001
            _fail(exc)
            ctx.compiled = False
            return FastLayerNorm.forward(ctx, x, weight, bias, eps)
        ctx.compiled, ctx.order, ctx.has_bias = True, order, bias is not None
        ctx.save_for_backward(X, mean, rstd, weight)
        return Y.reshape(tuple(x.shape[i] for i in order)).transpose(inverse(order))

    @staticmethod
    def backward(ctx, grad):
        if not ctx.compiled:
            return FastLayerNorm.backward(ctx, grad)
        X, mean, rstd, weight = ctx.pop_saved()
        need_x, need_w, need_b = ctx.needs_input_grad
        order = ctx.order
        G = np.ascontiguousarray(grad.transpose(order)).reshape(X.shape)   # a view when laid out like y
        if G.dtype != X.dtype:
            G = G.astype(X.dtype)
        dX, dw, db = _ln_backward(G, X, mean, rstd, rstd, weight, need_x)
        dx = dX.reshape(tuple(ctx.input_shapes[0][i] for i in order)).transpose(inverse(order)) if need_x else None
        return dx, (dw if need_w else None), (db if need_b and ctx.has_bias else None)


class _NormKernels:
    """What ``fast.norm.normalize`` / ``layer_norm_backward`` (the SGU's LayerNorm) call when
    the arrays suit a kernel; each returns None where it does not apply."""

    @staticmethod
    def normalize(x, eps):
        X, order = _row_matrix(x) if _applies(x) and x.size else (None, None)
        if X is None:
            return None
        xhat, _, rstd = _ln_forward(X, None, None, eps)
        shape_t = tuple(x.shape[i] for i in order)
        back = inverse(order)
        r = rstd.reshape(shape_t[:-1] + (1,)).transpose(back)
        return xhat.reshape(shape_t).transpose(back), r

    @staticmethod
    def backward(g, xhat, rstd, weight, out, need_dx, need_dweight, need_dbias):
        arrays = [a for a in (g, xhat, rstd, weight, out) if a is not None]
        if not _applies(*arrays) or not xhat.size:
            return None
        Xh, order = _row_matrix(xhat)
        if Xh is None or rstd.shape != xhat.shape[:-1] + (1,):
            return None
        O = None
        if out is not None and need_dx:
            O, o_order = _row_matrix(out)
            if O is None or o_order != order:
                return None
        G = np.ascontiguousarray(np.broadcast_to(g, xhat.shape).transpose(order)).reshape(Xh.shape)
        r = np.ascontiguousarray(rstd[..., 0].transpose(order[:-1])).reshape(-1)
        n = Xh.shape[0]
        dX, dw, db = _ln_backward(G, Xh, np.zeros(n, Xh.dtype), np.ones(n, Xh.dtype), r, weight, need_dx, out=O)
        dx = None
        if need_dx:
            dx = out if out is not None else dX.reshape(tuple(xhat.shape[i] for i in order)).transpose(inverse(order))
        return dx, (dw if need_dweight else None), (db if need_dbias else None)


class _GateKernels:
    """What ``fast.gating`` calls for the split SGU's elementwise work when the arrays suit a
    kernel (rows of width e with unit stride, one float dtype); each returns None where it does
    not apply. Arrays are token-major (S, B, e) views: F and the copy of z1 contiguous, the others
    in any order of their first two axes."""

    @staticmethod
    def forward(f, gamma, shift, residual, z1, out):
        """F = f gamma + shift (+ residual) into f, and z1 * F into ``out``, in one pass; returns
        the contiguous copy of z1 that backward needs."""
        arrays = [f, gamma, shift, z1, out] + ([residual] if residual is not None else [])
        if not _applies(*arrays) or not f.flags.c_contiguous or not f.size:
            return None
        S, B, e = f.shape
        views = [_token_rows(a) for a in (z1, out, residual if residual is not None else f)]
        if any(v is None for v in views):
            return None
        (zf, zss, zbs), (of, oss, obs), (rf, rss, rbs) = views
        kept = np.empty((S, B, e), dtype=f.dtype)
        _kernel("sgu_gate_forward", f.size)(f.reshape(-1), zf, zss, zbs, rf, rss, rbs, residual is not None,
                                            kept.reshape(-1), of, oss, obs, np.ascontiguousarray(gamma),
                                            np.ascontiguousarray(shift), S * B, e, B)
        return kept

    @staticmethod
    def backward(g, F, kept, dz1, gf):
        """dz1 = G F (when ``dz1`` is given) and G * z1 into ``gf`` (a new array when None), in one
        pass; returns ``(gf, per-token sums of gf)`` (the gate bias's gradient)."""
        arrays = [g, F, kept] + [a for a in (dz1, gf) if a is not None]
        if not _applies(*arrays) or not (F.flags.c_contiguous and kept.flags.c_contiguous) or not F.size:
            return None
        if gf is not None and not gf.flags.c_contiguous:
            return None
        S, B, e = F.shape
        gr = _token_rows(g)
        dr = _token_rows(dz1) if dz1 is not None else (F.reshape(-1), 0, 0)
        if gr is None or dr is None:
            return None
        gf = np.empty_like(F) if gf is None else gf
        sums = np.empty(S * B)
        _kernel("sgu_gate_backward", F.size)(gr[0], gr[1], gr[2], F.reshape(-1), kept.reshape(-1), dr[0], dr[1], dr[2],
                                             dz1 is not None, gf.reshape(-1), sums, S * B, e, B)
        return gf, sums.reshape(S, B).sum(axis=1).astype(F.dtype)

    @staticmethod
    def affine(x, w, b):
        """x * w + b over the last axis of a C-contiguous x, in one pass (None where it does not apply)."""
        if not _applies(x, w, b) or not x.flags.c_contiguous or not x.size:
            return None
        e = x.shape[-1]
        out = np.empty_like(x)
        _kernel("affine", x.size)(x.reshape(-1), np.ascontiguousarray(w), np.ascontiguousarray(b), out.reshape(-1),
                                  x.size // e, e)
        return out


def _token_rows(a):
    """``(flat, token stride, sample stride)`` (in elements) of an (S, B, e) view whose rows (the
    last axis) are contiguous, or None: ``flat`` runs from its first element to its last."""
    S, B, e = a.shape
    item = a.itemsize
    if (e > 1 and a.strides[-1] != item) or min(a.strides) < 0 or any(st % item for st in a.strides):
        return None
    ss, bs = a.strides[0] // item, a.strides[1] // item
    extent = (S - 1) * ss + (B - 1) * bs + e
    return np.lib.stride_tricks.as_strided(a, shape=(extent,), strides=(item,)), ss, bs


# --------------------------------------------------------------------------- optimizers
def _adam_direction(group, g, bufs, out, t):
    """``fast.optim.adam_direction`` in one compiled pass (same arithmetic, same dtype)."""
    b1, b2 = (float(b) for b in group["betas"])
    c1, root_c2 = 1.0 - b1**t, math.sqrt(1.0 - b2**t)
    s = g.dtype.type
    _kernel("adam", g.size)(g, bufs["exp_avg"], bufs["exp_avg_sq"], out, s(b1), s(1.0 - b1), s(b2), s(1.0 - b2),
                            s(float(group["eps"]) * root_c2), s(float(group["lr"]) * root_c2 / c1))


def _apply_update(p, u, decay):
    """p <- p * decay - u in one pass (False where a kernel does not apply)."""
    if not (_applies(p, u) and p.flags.c_contiguous and u.flags.c_contiguous):
        return False
    _kernel("apply_update", p.size)(p.reshape(-1), u.reshape(-1), p.dtype.type(decay))
    return True


# --------------------------------------------------------------------------- switching
def available():
    """Whether numba could be imported (and the kernels built)."""
    return bool(_K)


def is_enabled():
    return _state["enabled"]


def set_enabled(on):
    """Register the compiled implementations (True) or the NumPy fast path back (False)."""
    on = bool(on) and available()
    _state["enabled"] = on
    impls = (CompiledGELU, CompiledLayerNorm) if on else (FastGELU, FastLayerNorm)
    for impl, ref in zip(impls, (GELU, LayerNorm)):
        register(ref, "cpu")(impl)
    _norm.KERNELS = _NormKernels if on else None
    _gating.KERNELS = _GateKernels if on else None
    _optim.COMPILED = {"adam": _adam_direction, "apply_update": _apply_update} if on else {}


def set_threads(n):
    """Threads of the parallel kernels (numba's ``set_num_threads``)."""
    if _state["numba"] is not None:
        _state["numba"].set_num_threads(int(n))


def describe():
    """One line: what the compiled tier does in this process."""
    numba = _state["numba"]
    if numba is None:
        return "numba not installed: NumPy fast path (pip install -e \".[fast]\" for the compiled kernels)"
    if _state["error"]:
        return f"numba {numba.__version__} failed ({_state['error']}): NumPy fast path"
    if not _state["enabled"]:
        why = "TINYMLP_NUMBA=0" if _off_by_environment() else "switched off"
        return f"numba {numba.__version__} installed, {why}: NumPy fast path"
    cache = f"cache {_state['cache']}" if _state["cache"] else "no writable cache folder: compiled in every process"
    layer = numba.config.THREADING_LAYER
    return (f"numba {numba.__version__}, {numba.get_num_threads()} thread(s), threading layer {layer}, "
            f"serial below {PARALLEL_MIN} elements; {cache}")


def _setup():
    try:
        import numba
    except ImportError:
        return
    _state["numba"] = numba
    if "NUMBA_THREADING_LAYER" not in os.environ:
        numba.config.THREADING_LAYER = "workqueue"   # OpenMP's spinning threads starve OpenBLAS
    _state["cache"] = _cache_dir()
    if _state["cache"] is not None and "NUMBA_CACHE_DIR" not in os.environ:
        numba.config.CACHE_DIR = _state["cache"]
    try:
        _K.update(_build(numba))
    except Exception as exc:  # noqa: BLE001
        _state["error"] = f"{type(exc).__name__}: {exc}"
        return
    set_enabled(not _off_by_environment())


_setup()
