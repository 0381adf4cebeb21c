"""Errors shaped by a reduction over each row, and the known ops whose formula may be named.

A normalisation's backward has terms that reduce over each row (a mean of g, an inner product
of g with the row). When one of them is wrong, the error a - n has, in every row along one axis,
one of three shapes: a constant (``row_constant``), the row of the input itself times a
coefficient (``row_multiple``), or a + b x_hat, x_hat the centred row (``row_terms``). A sum
taken over the wrong axis (softmax's (g * p).sum(axis=0) where axis=-1 belongs) leaves another
shape: the error divided by the output is one term per row plus one term per column
(``wrong_axis``).

The rows may be larger than one axis: a group normalisation reduces over a *block* (a group of
channels and every position), a batch normalisation over the batch and the positions. So the
search runs over blocks, one run of k consecutive indices along each axis (``block_structure``),
and the largest block on which the error has one of the three shapes is the extent of the term
that is wrong, said in the input's own axes (``describe_block``) with the reshape that reduces
over it. When forward normalises the input over blocks (``block_normalisation``) and the error's
block is another one, backward reduces over the wrong extent (``wrong_extent``).

That structure is said for any layer. A formula is named only for the op that forward *is*:
``known_normalisation`` compares forward's output with the LayerNorm, RMSNorm and L2
normalisation of the checked input along that axis (each up to a gain and bias per column),
so an RMSNorm is never told LayerNorm's mean(g) term, and an unknown layer gets no formula.
"""

from __future__ import annotations

import itertools
import math

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


MAX_BLOCKS = 400  # candidate blocks tried, largest first


def candidate_blocks(shape, min_size=4):
    """Blocks as one run length per axis (a divisor of its size; 1: the block does not extend
    along it), at least ``min_size`` elements, largest first (trailing axes spanned first among
    equal sizes); every single whole axis is always among them."""
    options = [[k for k in range(n, 0, -1) if n % k == 0] for n in shape]
    found = sorted((b for b in itertools.product(*options) if math.prod(b) >= min_size),
                   key=lambda b: (-math.prod(b), [-k for k in reversed(b)]))[:MAX_BLOCKS]
    singles = [tuple(n if i == axis else 1 for i in range(len(shape))) for axis, n in enumerate(shape)]
    return found + [b for b in singles if b not in found and math.prod(b) >= min_size]


def by_block(arr, block):
    """arr as a (number of blocks, block size) matrix, one row per block."""
    shape = [m for n, k in zip(arr.shape, block) for m in (n // k, k)]
    d = arr.ndim
    view = arr.reshape(shape).transpose([2 * i for i in range(d)] + [2 * i + 1 for i in range(d)])
    return view.reshape(-1, math.prod(block))


def block_structure(err, x):
    """(kind, block) for the largest block on which the error has one shape in every block: a
    constant ("constant"), a multiple of x ("multiple") or a + b x ("terms"); the simplest shape
    first among blocks of one size. None when no block of at least 4 elements fits."""
    scale = np.linalg.norm(err)
    if scale == 0 or err.ndim == 0:
        return None
    for block in candidate_blocks(err.shape):
        e, xb = by_block(err, block), by_block(x, block)
        centred = e - e.mean(axis=-1, keepdims=True)
        if np.linalg.norm(centred) <= 1e-3 * scale:
            return "constant", block
        if np.linalg.norm(e - _project(e, xb)) <= 1e-3 * scale:
            return "multiple", block
        xc = xb - xb.mean(axis=-1, keepdims=True)
        if np.linalg.norm(centred - _project(centred, xc)) <= 1e-3 * scale:
            return "terms", block
    return None


def row_structure(run, c, result):
    """("row_constant" | "row_multiple" | "row_terms", axis) when the largest block on which
    a - n has one of the shapes is one whole axis; ("block_...", block) for any other block;
    else None. Needs every element."""
    a, n = result.analytical, result.numerical
    if a is None or n is None or np.isnan(n).any() or a.ndim == 0:
        return None
    found = block_structure(a - n, host(c.tensor.data).astype(np.float64))
    if found is None:
        return None
    kind, block = found
    axis = whole_axis(block, a.shape)
    return (f"row_{kind}", axis) if axis is not None else (f"block_{kind}", block)


def whole_axis(block, shape):
    """The axis when ``block`` is one whole axis and nothing else, else None."""
    spanned = [i for i, k in enumerate(block) if k > 1]
    return spanned[0] if len(spanned) == 1 and block[spanned[0]] == shape[spanned[0]] else None


def describe_block(block, shape):
    """The block in words ("3 consecutive indices of axis 1 ([0:3], [3:6]) x all 4 of axis 2") and the
    expression that takes a mean of g over each block, keeping g's shape for broadcasting."""
    parts, reshape, axes = [], [], []
    for axis, (n, k) in enumerate(zip(shape, block)):
        if k == n and k > 1:
            parts.append(f"all {n} of axis {axis}")
        elif k > 1:
            runs = ", ".join(f"[{lo}:{lo + k}]" for lo in range(0, n, k)[:3]) + (", ..." if n // k > 3 else "")
            parts.append(f"{k} consecutive indices of axis {axis} ({runs})")
        if 1 < k < n:
            reshape += [n // k, k]
        else:
            reshape.append(n)
        if k > 1:
            axes.append(len(reshape) - 1)
    dims = ", ".join(map(str, reshape))
    over = axes[0] if len(axes) == 1 else tuple(axes)
    return " x ".join(parts), f"g.reshape({dims}).mean(axis={over}, keepdims=True)"


def block_normalisation(run, c):
    """The block over which forward's one output is c normalised (centred and divided by the
    standard deviation over each block, up to a gain and bias along one axis), or None."""
    with no_grad():
        outputs = run.ev.outputs()
    if len(outputs) != 1 or tuple(outputs[0].shape) != tuple(c.tensor.shape) or c.tensor.ndim == 0:
        return None
    y = host(outputs[0].data).astype(np.float64)
    x = host(c.tensor.data).astype(np.float64)
    with np.errstate(all="ignore"):
        for block in candidate_blocks(x.shape):
            xb = by_block(x, block)
            zb = (xb - xb.mean(axis=-1, keepdims=True)) / xb.std(axis=-1, keepdims=True)
            z = _from_blocks(zb, block, x.shape)
            if not np.isfinite(z).all():
                continue
            if _misfit(z.reshape(1, -1), y.reshape(1, -1))[0] <= FIT_RTOL:
                return block
            for axis in range(x.ndim):  # a gain and bias per index along axis (a GroupNorm's per channel)
                if math.prod(n // k for i, (n, k) in enumerate(zip(x.shape, block)) if i != axis) < 2:
                    continue  # the elements of one gain each in one block: any normalisation would fit
                zz, yy = np.moveaxis(z, axis, -1), np.moveaxis(y, axis, -1)
                if _misfit(zz.reshape(-1, zz.shape[-1]), yy.reshape(-1, yy.shape[-1]))[0] <= FIT_RTOL:
                    return block
    return None


def _from_blocks(rows, block, shape):
    """The inverse of ``by_block``."""
    d = len(shape)
    outer = [n // k for n, k in zip(shape, block)]
    view = rows.reshape(outer + list(block))
    order = [i for axis in range(d) for i in (axis, d + axis)]
    return view.transpose(order).reshape(shape)


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
    shape = tuple(c.tensor.shape)
    block = axis if kind.startswith("block_") else tuple(n if i == axis else 1 for i, n in enumerate(shape))
    normalised = block_normalisation(run, c)
    if normalised is not None and normalised != block:
        return _wrong_extent(result, c, kind, block, normalised)
    if kind.startswith("block_"):
        return _block_hint(result, c, kind, block, normalised is not None)
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


_SHAPES = {"constant": "constant", "multiple": "that block of {name} times a coefficient that differs by block",
           "terms": "a combination of 1 and the block's normalised values (a + b x_hat)"}


def _block_hint(result, c, kind, block, normalised):
    """The error has its shape on blocks larger than one axis (a group of channels and positions)."""
    what, expr = describe_block(block, c.tensor.shape)
    shape = kind.split("_", 1)[1]
    size = math.prod(block)
    result.hint_kind = kind
    result.pattern += (f"; analytical - numerical is {_SHAPES[shape].format(name=repr(c.name))} on each block of "
                       f"{size} elements: {what}")
    if normalised:
        result.pattern += f"; forward normalises {c.name!r} over these same blocks"
        terms = {"constant": "the block-mean term mean(g) is missing or off",
                 "multiple": "the term x_hat * mean(g * x_hat) has a wrong coefficient in each block",
                 "terms": "the terms mean(g) and x_hat * mean(g * x_hat) are off"}[shape]
        result.hint = (f"{terms} (g: the incoming gradient times the gain); each mean is over a block, {expr}, not "
                       "over one axis; compare r * (g - mean(g) - x_hat * mean(g * x_hat)) term by term, every mean "
                       "over the block, as forward's mean and variance are")
    else:
        result.hint = (f"a term of backward that reduces g over each such block ({expr}, or the sum) is missing, "
                       "extra or wrong: the error has one shape over every element of a block, so the term is a "
                       "reduction over the block, not over one axis")
    return True


def _wrong_extent(result, c, kind, block, normalised):
    """Forward normalises over one block; the error has its structure over another."""
    shape = tuple(c.tensor.shape)
    where, _ = describe_block(block, shape)
    forward, expr = describe_block(normalised, shape)
    axis = whole_axis(block, shape)
    if axis is not None:
        where = f"axis {axis} only"
    result.hint_kind = "wrong_extent"
    result.pattern += (f"; analytical - numerical is {_SHAPES[kind.split('_', 1)[1]].format(name=repr(c.name))} over "
                       f"{where} (blocks of {math.prod(block)}), and differs within forward's blocks: forward "
                       f"normalises {c.name!r} over blocks of {math.prod(normalised)}, {forward}")
    result.hint = (f"backward reduces over another extent than forward: its error is structured over {where}, "
                   f"while forward's mean and variance run over {forward}; take every mean (or sum) in backward over "
                   f"forward's block, {expr}")
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
