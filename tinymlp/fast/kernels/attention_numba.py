"""Softmax along rows on the CPU, compiled by numba: forward and backward one pass per row.

Forward scales a row of scores, subtracts its maximum, exponentiates, sums and normalises, in
place; backward turns dL/dP into dL/dS = P * (dL/dP - rowsum(dL/dP * P)) in place. A row is
short (the tokens of one query) and stays in cache between the loops.

In float32 the exponential is ``exp32`` below, plain arithmetic that vectorises: numba calls
libm's scalar ``expf`` otherwise (7x slower than NumPy's SIMD ``exp``). float64 keeps libm's exp.
The fast tier's ``CompiledAttention`` and ``CompiledSoftmax`` (fast/attention.py) call
``softmax_rows`` and ``softmax_rows_backward``; the formulas are derived in ops/attention.py.
"""

from __future__ import annotations

import numpy as np

from .. import compiled
from ..compiled import float32_from_bits, prange

__all__ = ["exp32", "softmax_rows", "softmax_rows_backward"]


def _exp32(x):
    # exp(x) for x <= 0 in float32 (Cephes' expf, about 1 ulp): x = n ln 2 + r with |r| <= ln2/2,
    # e^r by a polynomial, 2^n (n >= -125) from its bits. Below ln(2^-125) the result is 0 (it would
    # be under 3e-38). A NaN stays NaN (the comparison sends it to n = -125, r is NaN).
    t = x * np.float32(1.44269504088896341)
    t = t if t > np.float32(-125) else np.float32(-125)
    n = np.floor(t + np.float32(0.5))
    r = x - n * np.float32(0.693359375) - n * np.float32(-2.12194440e-4)
    p = np.float32(1.9875691500e-4) * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    p = p * r * r + r + np.float32(1)
    p *= float32_from_bits((np.int32(n) + np.int32(127)) << np.int32(23))    # 2^n
    return np.float32(0) if x < np.float32(-86.64) else p


exp32 = compiled.inline(_exp32)


def _scaled_max(row, m, scale):
    # row <- scale * row, and its maximum: eight running maxima (a maximum over one running value
    # does not vectorise), then the rest of the row
    t0 = row[0] * scale
    t1 = t2 = t3 = t4 = t5 = t6 = t7 = t0
    full = m - m % 8
    for j in range(0, full, 8):
        v0, v1, v2, v3 = row[j] * scale, row[j + 1] * scale, row[j + 2] * scale, row[j + 3] * scale
        v4, v5, v6, v7 = row[j + 4] * scale, row[j + 5] * scale, row[j + 6] * scale, row[j + 7] * scale
        row[j], row[j + 1], row[j + 2], row[j + 3] = v0, v1, v2, v3
        row[j + 4], row[j + 5], row[j + 6], row[j + 7] = v4, v5, v6, v7
        t0, t1, t2, t3 = max(t0, v0), max(t1, v1), max(t2, v2), max(t3, v3)
        t4, t5, t6, t7 = max(t4, v4), max(t5, v5), max(t6, v6), max(t7, v7)
    top = max(max(max(t0, t1), max(t2, t3)), max(max(t4, t5), max(t6, t7)))
    for j in range(full, m):
        v = row[j] * scale
        row[j] = v
        top = max(top, v)
    return top


scaled_max = compiled.inline(_scaled_max)


def _softmax32(s, n, m, scale):
    # each row of s (n, m), flat: s <- softmax(scale * s), in float32 with exp32
    for i in prange(n):
        row = s[i * m:i * m + m]
        top = scaled_max(row, m, scale)
        total = np.float32(0)
        for j in range(m):
            e = exp32(row[j] - top)
            row[j] = e
            total += e
        inv = np.float32(1) / total
        for j in range(m):
            row[j] *= inv


def _softmax64(s, n, m, scale):
    # the same in float64, with libm's exp
    for i in prange(n):
        row = s[i * m:i * m + m]
        top = scaled_max(row, m, scale)
        total = 0.0
        for j in range(m):
            e = np.exp(row[j] - top)
            row[j] = e
            total += e
        inv = 1.0 / total
        for j in range(m):
            row[j] *= inv


def _softmax_backward(p, ds, n, m, scale):
    # each row: ds <- scale * p * (ds - sum_j ds_j p_j)
    for i in prange(n):
        pr = p[i * m:i * m + m]
        dr = ds[i * m:i * m + m]
        dot = dr[0] - dr[0]          # zero in the arrays' dtype
        for j in range(m):
            dot += dr[j] * pr[j]
        for j in range(m):
            dr[j] = pr[j] * (dr[j] - dot) * scale


SOFTMAX32, SOFTMAX64 = compiled.jit(_softmax32, reduce=True), compiled.jit(_softmax64, reduce=True)
SOFTMAX_BACKWARD = compiled.jit(_softmax_backward, reduce=True)


def _rows(a):
    """a as a flat view and its row length, or None unless a is C-contiguous and the kernels take it."""
    if not (compiled.applies(a) and a.flags.c_contiguous and a.size and a.ndim):
        return None
    return a.reshape(-1), a.shape[-1]


def softmax_rows(s, scale=1.0):
    """s <- softmax(scale * s) along the last axis, in place; False where the kernel does not
    take s (a C-contiguous float32 or float64 array) or failed (it wrote nothing)."""
    rows = _rows(s)
    if rows is None:
        return False
    flat, m = rows
    t = s.dtype.type
    try:
        compiled.kernel(SOFTMAX32 if s.dtype == np.float32 else SOFTMAX64, flat.size)(flat, flat.size // m, m, t(scale))
    except compiled.KernelFailed:
        return False
    return True


def softmax_rows_backward(p, ds, scale=1.0):
    """ds <- scale * p * (ds - rowsum(ds * p)) along the last axis, in place; False where the
    kernel does not take the arrays (both C-contiguous, one float dtype, one shape) or failed."""
    rows = _rows(ds)
    if rows is None or _rows(p) is None or p.shape != ds.shape or p.dtype != ds.dtype:
        return False
    flat, m = rows
    try:
        compiled.kernel(SOFTMAX_BACKWARD, flat.size)(p.reshape(-1), flat, flat.size // m, m, ds.dtype.type(scale))
    except compiled.KernelFailed:
        return False
    return True
