"""A broadcast tensor's gradient, position by position: which axes backward summed over.

A per-channel parameter (Swish's beta of shape (C,)) is broadcast in forward over the batch and
the positions, so its gradient is the sum, over the axes it was stretched along, of one
contribution per position. A backward that sums over another axis of the same size runs without
any shape error and gives numbers that look unrelated to the true gradient. Those contributions
can be measured: forward runs on the tensor stretched to the full shape (the same values, so the
same output), and central differences on each copy give each position's contribution.
``summed_over`` then finds the axes whose sum gives backward's gradient and those whose sum gives
the numerical one, and says "summed over axis 1 where axis 0 belongs".
"""

from __future__ import annotations

import itertools

import numpy as np

from ..grad_mode import no_grad
from ..backend import to_device
from ..tensor import Tensor
from .plan import close_bits, host

MAX_STRETCHED = 4096  # at most this many positions are measured (two forwards each)


def _targets(run, c):
    """Shapes that c broadcasts to, larger than c: forward's outputs', then the other tensors'."""
    with no_grad():
        outputs = run.ev.outputs()
    shapes = [tuple(y.shape) for y in outputs]
    shapes += [tuple(o.tensor.shape) for o in run.checked if o is not c]
    shapes += [tuple(a.shape) for a in run.plan.args if isinstance(a, Tensor)]
    found = []
    for shape in shapes:
        try:
            fits = np.broadcast_shapes(tuple(c.tensor.shape), shape) == shape
        except ValueError:
            continue
        if fits and int(np.prod(shape)) > c.size and shape not in found and int(np.prod(shape)) <= MAX_STRETCHED:
            found.append(shape)
    return found, [host(y.data).copy() for y in outputs]


def contributions(run, c):
    """(stretched shape, contributions) measured with c stretched to a shape forward accepts and
    computes the same output with; None when there is none."""
    shapes, before = _targets(run, c)
    original = c.tensor.data
    for shape in shapes:
        stretched = to_device(np.ascontiguousarray(np.broadcast_to(host(original), shape)), c.tensor.device)
        try:
            c.tensor.data = stretched
            with no_grad():
                outputs = [host(y.data) for y in run.ev.outputs()]
            if len(outputs) != len(before) or not all(map(close_bits, before, outputs)):
                continue
            n = run.ev.central_differences(c.tensor, np.arange(stretched.size), run.settings.eps, run.L0)[0]
            return shape, n.reshape(shape)
        except Exception:  # noqa: BLE001 - forward does not accept the stretched tensor
            continue
        finally:
            c.tensor.data = original
    return None


def _sums(parts, size):
    """{axes: the sum of parts over those axes, flattened} for every set of axes leaving ``size`` elements."""
    out = {}
    for r in range(1, parts.ndim + 1):
        for axes in itertools.combinations(range(parts.ndim), r):
            kept = int(np.prod([n for i, n in enumerate(parts.shape) if i not in axes]))
            if kept == size:
                out[axes] = parts.sum(axis=axes).reshape(-1)
    return out


def summed_over(run, c, result):
    """Backward's gradient of a broadcast tensor is the sum of its per-position contributions over
    other axes than those forward stretched it along. Sets the hint; True if so."""
    a, n = result.analytical, result.numerical
    if a is None or n is None or np.isnan(n).any() or c.size < 2:
        return False
    found = contributions(run, c)
    if found is None:
        return False
    shape, parts = found
    s = run.settings
    tol = dict(rtol=10 * s.rtol, atol=s.atol_eff)
    sums = _sums(parts, c.size)
    right = [axes for axes, total in sums.items() if np.allclose(total, n.reshape(-1), **tol)]
    wrong = [axes for axes, total in sums.items() if np.allclose(total, a.reshape(-1), **tol)]
    if not right or not wrong or set(right) & set(wrong):
        return False
    r, w = _axes(right[0]), _axes(wrong[0])
    name = c.name
    result.hint_kind = "summed_over_wrong_axis"
    belongs = "belongs" if len(right[0]) == 1 else "belong"
    result.pattern += (f"; forward broadcasts {name!r} {tuple(c.tensor.shape)} to {shape}: its gradient is the sum "
                       f"over {r} of one contribution per position (measured by moving each position's copy of "
                       f"{name!r} alone), and backward's gradient is exactly their sum over {w}")
    result.hint = (f"the gradient of {name!r} is summed over {w} where {r} {belongs} (forward broadcasts {name!r} "
                   f"along {r}): sum over axis={_code(right[0])}; the sizes agree, so no shape error shows it "
                   "(autograd.unbroadcast(grad, shape) sums over exactly the broadcast axes)")
    return True


def _axes(axes):
    return f"axis {axes[0]}" if len(axes) == 1 else "axes " + ", ".join(map(str, axes[:-1])) + f" and {axes[-1]}"


def _code(axes):
    return str(axes[0]) if len(axes) == 1 else str(tuple(axes))
