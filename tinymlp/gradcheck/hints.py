"""Hints read off the failure's own structure, each offered only when the numbers support it.

* ``input_factor``: analytical / numerical equals an input's value (a temperature, a gain), or
  its inverse or square, on every failing element: backward is off by that *factor* (said with
  the input's name), not by a term that happens to fit;
* ``row_factor``: the ratio is constant along each row of one axis and differs between rows;
* ``repeated_index``: the failing rows are exactly the ids that an integer input repeats (a
  scatter that keeps one contribution per repeated id);
* ``batch_mixed``: forward treats the rows of the batch independently and backward is right on
  each row alone, but wrong in the batch (a reduction over the whole batch);
* ``row_hint``: the error a - n, row by row, is constant, a multiple of the row of x, or a + b x_hat.
  A known op's formula is named only when forward *is* that op (``known_normalisation``
  compares forward's output with LayerNorm, RMSNorm and L2 normalisation of the checked input);
  any other layer gets the structure alone.
"""

from __future__ import annotations

import math

import numpy as np

from ..grad_mode import enable_grad, no_grad
from ..backend import to_device
from ..tensor import Tensor
from .plan import host, leaf
from .report import FAIL

FACTOR_RTOL = 1e-5  # a ratio this close to an input's value is that value


def _flat(ch, shape):
    return int(np.ravel_multi_index(ch.index, shape)) if ch.index else 0


def _usable(run, elements):
    """The failing elements whose numerical gradient is above the noise floor."""
    floor = run.settings.atol_eff
    return [ch for ch in elements if abs(ch.numerical) > floor and math.isfinite(ch.analytical)]


def _named_values(run):
    """(name, kind, float64 host values) of every checked tensor and float constant input."""
    out = [(c.name, c.kind, host(c.tensor.data).astype(np.float64)) for c in run.checked]
    checked = {id(c.tensor) for c in run.checked}
    for name, arg in zip(run.plan.input_names, run.plan.args):
        data = arg.data if isinstance(arg, Tensor) else arg
        if id(arg) not in checked and hasattr(data, "dtype") and data.dtype.kind == "f":
            out.append((name, "input", host(data).astype(np.float64)))
    return out


def _listed(values, fmt="{}"):
    values = list(values)
    return ", ".join(fmt.format(v) for v in values[:6]) + (" ..." if len(values) > 6 else "")


# ------------------------------------------------------------------------------- factors


_POWERS = (
    (1, "{s}", "a division by {s} where {s}^2 belongs, or a factor {s} applied once too often"),
    (-1, "1/{s}", "a factor {s} missing, or {s}^2 where {s} belongs"),
    (2, "{s}^2", "{s} multiplied where it divides, or a factor {s} applied twice too often"),
    (-2, "1/{s}^2", "a division by {s} where it multiplies, or {s}^3 where {s} belongs"),
)


def input_factor(run, c, result, elements):
    """analytical / numerical equals an input's values (a scalar, or element by element after
    broadcasting to c's shape), their inverse or their square: say it as that factor."""
    use = _usable(run, elements)
    if not use:
        return False
    shape = tuple(c.tensor.shape)
    flat = np.array([_flat(ch, shape) for ch in use])
    ratio = np.array([ch.analytical / ch.numerical for ch in use])
    for name, kind, values in _named_values(run):
        try:
            v = np.broadcast_to(values, shape).reshape(-1)[flat]
        except ValueError:
            continue
        if np.any(v == 0) or np.allclose(np.abs(v), 1):
            continue
        for power, form, cause in _POWERS:
            target = v ** power
            if not np.all(np.abs(ratio - target) <= FACTOR_RTOL * np.abs(target)):
                continue
            factor = form.format(s=name)
            single = values.size == 1 or np.all(values == values.reshape(-1)[0])
            value = f" = {float(values.reshape(-1)[0]):.4g}" if single else ", element by element"
            seen = (f"analytical / numerical = {ratio[0]:.4g}" if single else
                    f"analytical / numerical equals {factor} element by element")
            on = "the 1 failing element" if len(use) == 1 else f"all {len(use)} failing elements"
            result.hint_kind = "factor_of_input"
            result.pattern = f"analytical = {factor} x numerical on {on} ({seen}; {name} is {kind} {name!r})"
            result.hint = (f"backward is off by a factor {factor} (= {kind} {name!r}{value}): {cause.format(s=name)}; "
                           f"count the powers of {name} in backward against the derivation")
            return True
    return False


def row_factor(run, c, result, elements):
    """Every element fails, and analytical / numerical is constant along each row of one axis
    (the elements sharing one index along it) but differs between rows."""
    use = _usable(run, elements)
    shape = tuple(c.tensor.shape)
    if len(shape) < 2 or len(use) < len(elements) or len(use) < 4:
        return False
    pos = np.array([ch.index for ch in use])
    ratio = np.array([ch.analytical / ch.numerical for ch in use])
    for axis in range(len(shape)):
        rows = np.unique(pos[:, axis])
        if len(rows) < 2:
            continue
        groups = [ratio[pos[:, axis] == i] for i in rows]
        if any(len(g) < 2 for g in groups):
            continue
        medians = np.array([np.median(g) for g in groups])
        if not all(np.all(np.abs(g - m) <= 1e-4 * abs(m)) for g, m in zip(groups, medians)):
            continue
        if np.ptp(medians) <= 1e-3 * np.abs(medians).max():
            return False  # one factor for all: the constant-ratio hints say it
        listed = _listed(medians, "{:.4g}")
        result.hint_kind = "row_factor"
        result.pattern = (f"all {len(use)} elements fail; analytical / numerical is constant along each row of axis "
                          f"{axis} (the elements sharing one index along axis {axis}) and differs between rows: "
                          f"{listed}")
        result.hint = (f"backward is off by a factor that differs by row of axis {axis} ({listed}): a per-row "
                       "quantity (a row's norm, mean, count or temperature) applied once too often, missing, or "
                       "taken from another row; compare every per-row factor of backward with the derivation")
        return True
    return False


# ------------------------------------------------------------------------------- repeated indices


def _integer_inputs(run):
    found = [(name, arg.data if isinstance(arg, Tensor) else arg) for name, arg in
             zip(run.plan.input_names, run.plan.args)]
    found += list(run.ev.kwargs.items())
    return [(name, host(a)) for name, a in found
            if hasattr(a, "dtype") and hasattr(a, "shape") and np.dtype(a.dtype).kind in "iu" and a.size]


def repeated_index(run, c, result, checks):
    """The failing elements are exactly in the rows whose index an integer input repeats."""
    elements = [ch for ch in checks if not isinstance(ch.index, str)]
    shape = tuple(c.tensor.shape)
    if not elements or not shape:
        return False
    fail = np.array([ch.status == FAIL for ch in elements])
    pos = np.array([ch.index for ch in elements])
    for ids_name, ids in _integer_inputs(run):
        values, counts = np.unique(ids.reshape(-1), return_counts=True)
        repeated = values[counts > 1]
        if not len(repeated) or values.min() < 0:
            continue
        for axis, size in enumerate(shape):
            if values.max() >= size:
                continue
            failing = np.unique(pos[fail, axis])
            if not len(failing) or not np.isin(failing, repeated).all() or 2 * len(failing) < len(repeated):
                continue
            rows = "rows" if axis == 0 else f"indices along axis {axis}"
            times = _listed((f"{v}: {k} times" for v, k in zip(values, counts) if k > 1))
            result.hint_kind = "repeated_index"
            result.pattern = (f"the failing elements are in {rows} {_listed(failing)} of {c.name!r}, ids repeated in "
                              f"{ids_name!r} ({times}); the rows of ids that occur once are right")
            target = f"d{c.name.split('.')[-1]}"
            where = ids_name if axis == 0 else f"(slice(None),) * {axis} + ({ids_name},)"
            result.hint = (f"a scatter that keeps one contribution per repeated index: {target}[{where}] += ... "
                           "(fancy-index assignment) writes each repeated index once, so its other contributions "
                           f"are lost; accumulate them all with np.add.at({target}, {where}, ...)")
            return True
    return False


# ------------------------------------------------------------------------------- rows of a batch


def _row_of(arg, i, batch, checked):
    """Row i of an argument whose leading axis is the batch (a fresh leaf for a checked tensor)."""
    if isinstance(arg, Tensor) and arg.ndim and arg.shape[0] == batch:
        return leaf(arg.data[i:i + 1].copy(), id(arg) in checked, arg.name)
    if not isinstance(arg, Tensor) and hasattr(arg, "shape") and len(arg.shape) and arg.shape[0] == batch:
        return arg[i:i + 1]
    return arg


def batch_mixed(run, c, result, max_rows=8):
    """Forward is row-wise along axis 0 of input c, and backward on each failing row alone agrees
    with the numerical gradient, while the batch's backward fails: backward mixes the rows."""
    a, n, s = result.analytical, result.numerical, run.settings
    shape = tuple(c.tensor.shape)
    if c.kind != "input" or len(shape) < 2 or shape[0] < 2 or n is None or np.isnan(n).any():
        return False
    batch = shape[0]
    bad = np.abs(a - n) > s.atol_eff + s.rtol * np.abs(n)
    rows = [i for i in range(batch) if bad[i].any()]
    if len(rows) < 2:
        return False
    with no_grad():
        full = [host(y.data).copy() for y in run.ev.outputs()]
    if not full or any(y.ndim == 0 or y.shape[0] != batch for y in full):
        return False
    checked = {id(t.tensor) for t in run.checked}
    params = [(sw.param, sw.param.grad) for sw in run.plan.swaps]
    position = next((k for k, arg in enumerate(run.plan.args) if arg is c.tensor), None)
    if position is None:
        return False
    try:
        for i in rows[:max_rows]:
            args = [_row_of(arg, i, batch, checked) for arg in run.plan.args]
            ev = type(run.ev)(run.ev.fn, args, run.ev.kwargs, run.ev.before_forward, run.ev.xp)
            with enable_grad():
                outputs = ev.outputs()
            if len(outputs) != len(full):
                return False
            for y, want, g in zip(outputs, full, run.ev.upstream):
                got = host(y.data)
                if got.shape != want[i:i + 1].shape or not np.allclose(got, want[i:i + 1], rtol=1e-9,
                                                                      atol=1e-12 * (np.abs(want).max() or 1)):
                    return False  # rows are not independent in forward
                if y.requires_grad:
                    g_row = host(g).reshape(want.shape)[i:i + 1]
                    y.backward(to_device(np.ascontiguousarray(g_row), y.device))
            alone = args[position].grad
            if alone is None or (np.abs(host(alone)[0] - n[i]) > s.atol_eff + s.rtol * np.abs(n[i])).any():
                return False
    except Exception:  # noqa: BLE001 - fn cannot run on one row: no hint
        return False
    finally:
        for p, grad in params:
            p.grad = grad
    tried = rows[:max_rows]
    result.hint_kind = "batch_mixed"
    result.pattern += (f"; forward treats the {batch} rows of axis 0 independently (each row alone gives its row of "
                       f"the output), and backward on each row alone agrees with the numerical gradient (rows "
                       f"{_listed(tried)} tried): only in the batch is the gradient of {c.name!r} wrong")
    result.hint = ("backward mixes the rows of the batch: a sum or mean taken over the whole batch where forward "
                   "reduces each row by itself (e.g. (g * y).sum() where (g * y).sum(axis=-1, keepdims=True) "
                   "belongs); a batch of one cannot show this")
    return True
