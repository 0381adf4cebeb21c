"""Errors shaped by a reduction over each row, and the known ops whose formula may be named.

A normalisation's backward has terms that reduce over each row (a mean of g, an inner product
of g with the row). When one of them is wrong, the error a - n has, in every row along one axis,
one of three shapes: a constant (``row_constant``), the row of the input itself times a
coefficient (``row_multiple``), or a + b x_hat, x_hat the centred row (``row_terms``). A sum
taken over the wrong axis (softmax's (g * p).sum(axis=0) where axis=-1 belongs) leaves another
shape: the error divided by the output is one term per row plus one term per column
(``wrong_axis``).

That structure is said for any layer. A formula is named only for the op that forward *is*:
``known_normalisation`` compares forward's output with the LayerNorm, RMSNorm and L2
normalisation of the checked input along that axis (each up to a gain and bias per column),
so an RMSNorm is never told LayerNorm's mean(g) term, and an unknown layer gets no formula.
"""

from __future__ import annotations

import numpy as np

from ..grad_mode import no_grad
from .plan import host

NORMALISATIONS = {  # op -> (forward of one row, the backward to compare with, for the likely line)
    "LayerNorm": (lambda x: (x - x.mean(-1, keepdims=True)) / x.std(-1, keepdims=True),
                  "the row-mean terms of a normalisation's backward are off: g.mean() and x_hat * (g * x_hat).mean() "
                  "(a mean divided by D twice, a term missing or with the wrong sign); compare "
                  "r * (g - mean(g) - x_hat * mean(g * x_hat)) term by term"),
    "RMSNorm": (lambda x: x / np.sqrt((x * x).mean(-1, keepdims=True)),
                "the row term of RMSNorm's backward is off (forward: x_hat = x * r, r = 1 / sqrt(mean(x^2) + eps), "
                "times a gain): compare r * (g - x_hat * mean(g * x_hat)) term by term, g being the incoming "
                "gradient times the gain; RMSNorm has no mean(g) term"),
    "L2 normalisation": (lambda x: x / np.sqrt((x * x).sum(-1, keepdims=True)),
                         "the row term of the L2 normalisation's backward is off (forward: y = x / ||x||): compare "
                         "(g - y * sum(g * y)) / ||x|| term by term, the sum taken over each row "
                         "(axis=-1, keepdims=True)"),
}
FIT_RTOL = 1e-4  # forward's output within this of an op's (eps inside a sqrt moves it by eps / var)


def row_structure(run, c, result):
    """("row_constant" | "row_multiple" | "row_terms", axis) when a - n has that shape in every
    row along one axis (the last axis first); else None. Needs every element and rows of >= 4."""
    a, n = result.analytical, result.numerical
    if a is None or n is None or np.isnan(n).any() or a.ndim == 0:
        return None
    err = a - n
    scale = np.linalg.norm(err)
    if scale == 0:
        return None
    x = host(c.tensor.data).astype(np.float64)
    for axis in sorted(range(a.ndim), key=lambda k: k != a.ndim - 1):
        if a.shape[axis] < 4:
            continue
        e, xr = np.moveaxis(err, axis, -1), np.moveaxis(x, axis, -1)
        centred = e - e.mean(axis=-1, keepdims=True)
        if np.linalg.norm(centred) <= 1e-3 * scale:
            return "row_constant", axis
        if np.linalg.norm(e - _project(e, xr)) <= 1e-3 * scale:
            return "row_multiple", axis
        xc = xr - xr.mean(axis=-1, keepdims=True)
        if np.linalg.norm(centred - _project(centred, xc)) <= 1e-3 * scale:
            return "row_terms", axis
    return None


def _project(e, v):
    """Each row of e projected on the same row of v."""
    vv = (v * v).sum(axis=-1, keepdims=True)
    return np.where(vv > 0, (e * v).sum(axis=-1, keepdims=True) / np.where(vv > 0, vv, 1), 0) * v


def known_normalisation(run, c, axis):
    """The name of the op in NORMALISATIONS that forward's one output is, of c along ``axis``
    (up to a gain, or a gain and bias, per column), or None. Ops that differ by a constant factor
    (RMSNorm is sqrt(D) times the L2 normalisation) fit equally well: the one whose fitted gain
    is nearest 1 is named (an L2 normalisation has no gain; an RMSNorm's gain is about 1)."""
    with no_grad():
        outputs = run.ev.outputs()
    if len(outputs) != 1 or tuple(outputs[0].shape) != tuple(c.tensor.shape):
        return None
    y = np.moveaxis(host(outputs[0].data).astype(np.float64), axis, -1)
    x = np.moveaxis(host(c.tensor.data).astype(np.float64), axis, -1)
    best = None
    with np.errstate(all="ignore"):
        for op, (forward, _) in NORMALISATIONS.items():
            z = forward(x)
            if not np.isfinite(z).all():
                continue
            misfit, gain = _misfit(z.reshape(-1, z.shape[-1]), y.reshape(-1, y.shape[-1]))
            if misfit <= FIT_RTOL:
                key = abs(np.log(gain)) if gain > 0 else np.inf
                if best is None or key < best[0]:
                    best = (key, op)
    return None if best is None else best[1]


def _misfit(z, y):
    """(misfit, gain): how far y is from z, from w z or from w z + b (w, b per column, fitted over
    the rows), relative to |y|, the closest of the three; and the typical size of its gain w (the
    median |w|; 1 for y = z). A fit needs more rows than it has parameters per column."""
    size = np.linalg.norm(y) or 1.0
    fits = [(np.linalg.norm(y - z) / size, 1.0)]
    rows = z.shape[0]
    if rows >= 2:
        zz = (z * z).sum(0)
        w = np.where(zz > 0, (z * y).sum(0) / np.where(zz > 0, zz, 1), 0)
        fits.append((np.linalg.norm(y - w * z) / size, float(np.median(np.abs(w)))))
    if rows >= 3:
        zc, yc = z - z.mean(0), y - y.mean(0)
        zz = (zc * zc).sum(0)
        w = np.where(zz > 0, (zc * yc).sum(0) / np.where(zz > 0, zz, 1), 0)
        fits.append((np.linalg.norm(yc - w * zc) / size, float(np.median(np.abs(w)))))
    return min(fits)


def row_hint(run, c, result):
    """Set the pattern and likely lines when the error has a row structure; True if it has."""
    found = row_structure(run, c, result)
    if found is None:
        return False
    kind, axis = found
    result.hint_kind = kind
    op = known_normalisation(run, c, axis) if kind != "row_constant" else None
    if kind == "row_constant":
        result.pattern += f"; analytical - numerical is constant along axis {axis} in each row"
        result.hint = (f"a term like g.mean(axis={axis}, keepdims=True) is missing or extra in backward: the "
                       "error is the same for every element of a row (the row-mean term of a normalisation, "
                       "or a term that should be summed over the row)")
        return True
    if kind == "row_multiple":
        result.pattern += (f"; analytical - numerical is, in each row along axis {axis}, that row of {c.name!r} "
                           "times a coefficient that differs by row")
        generic = (f"a term c * {c.name} of backward has a wrong coefficient c in each row: c is an inner product, "
                   f"sum or mean over the row (axis {axis}) computed wrong (a wrong axis, a missing or extra 1/n, a "
                   "wrong sign); write out the terms of backward that reduce over the row and compare them with "
                   "the derivation")
    else:
        result.pattern += (f"; analytical - numerical is, in each row along axis {axis}, a combination of 1 and "
                           "the row's normalised values (a + b x_hat)")
        generic = (f"the terms of backward that reduce over each row (axis {axis}) are off: in each row the error "
                   "is a + b * x_hat (a row mean or sum of g, and an inner product with the normalised row); "
                   "compare each of them with the derivation (a mean divided by the row length twice, a term "
                   "missing or with the wrong sign)")
    if op is not None:
        result.pattern += f"; forward is the {op} of {c.name!r} along axis {axis}"
    result.hint = generic if op is None else NORMALISATIONS[op][1]
    return True


def wrong_axis(run, c, result):
    """(a - n) / y, y forward's one output of c's shape, is u + v with u constant along the last
    axis and v constant along another axis k: two reductions of g, over k and over the last axis,
    where backward should have one. Sets the hint; True if so."""
    a, n = result.analytical, result.numerical
    if a is None or n is None or a.ndim < 2 or np.isnan(n).any() or a.shape[-1] < 3:
        return False
    with no_grad():
        outputs = run.ev.outputs()
    if len(outputs) != 1 or tuple(outputs[0].shape) != a.shape:
        return False
    y = host(outputs[0].data).astype(np.float64)
    if not np.all(np.abs(y) > 1e-12 * np.abs(y).max(initial=0.0)):
        return False
    q = (a - n) / y
    last = a.ndim - 1
    for k in range(last):
        if a.shape[k] < 3:
            continue
        u, v = q.mean(axis=last, keepdims=True), q.mean(axis=k, keepdims=True)
        residual = q - u - v + q.mean(axis=(k, last), keepdims=True)
        size = np.linalg.norm(q)
        spread_u, spread_v = (np.linalg.norm(t - t.mean()) for t in (u, v))
        if np.linalg.norm(residual) <= 1e-6 * size and min(spread_u, spread_v) > 1e-3 * size / np.sqrt(q.size):
            result.hint_kind = "wrong_axis"
            result.pattern += (f"; (analytical - numerical) / output is one term per row of axis {k} plus one term "
                               f"per row of axis {last}: the error comes from reductions of g over axis {k} and "
                               f"over axis {last}")
            result.hint = (f"backward reduces over the wrong axis: a sum or mean over axis {k} where forward's runs "
                           f"over axis {last} (or the other way round), e.g. (g * y).sum(axis={k}) where "
                           "(g * y).sum(axis=-1, keepdims=True) belongs; check the axis= of every sum and mean in "
                           "backward")
            return True
    return False
