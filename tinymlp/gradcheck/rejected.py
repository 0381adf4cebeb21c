"""A gradient the engine rejected outright: what its shape or dtype says about the bug.

The engine refuses a gradient of another shape or dtype than its input (``contract.py``), so no
element can be compared; the shapes themselves are the clue: the transpose of the expected shape
(W vs W.T), a shape that sums down to the input's (a broadcast input whose gradient was not
summed, with the axes to sum), another input's shape (gradients returned out of order), fewer
gradients than inputs, or a downcast.
"""

from __future__ import annotations

import numpy as np


def explain_engine_error(result, parsed, input_names=(), shapes=None):
    """The engine rejected the gradient backward produced for this tensor (shape or dtype).

    ``input_names`` (forward's inputs, in order) and ``shapes`` ({checked name: shape}) let the
    hint say when a gradient has the shape of another input: gradients returned out of order.
    """
    result.verdict, result.error = "FAIL", parsed["text"]
    result.pattern = f"backward raised: {parsed['text']}"
    if parsed["kind"] == "count":  # the engine counted: fewer gradients than inputs
        result.hint_kind = "too_few_gradients"
        got = int(parsed["got"])
        result.hint = (f"{parsed['fn']}.backward returned {got} gradient{'s' * (got != 1)} for {parsed['want']} "
                       "inputs: return one gradient per input of forward, in order (None where none is needed)")
        return
    if parsed["kind"] == "dtype":
        way = "downcast" if np.dtype(parsed["got"]).itemsize < np.dtype(parsed["want"]).itemsize else "upcast"
        result.pattern = (f"backward raised: {parsed['fn']}.backward returned a {parsed['got']} gradient for a "
                          f"{parsed['want']} input (a {way})")
        result.hint = (f"{parsed['fn']}.backward returns a {parsed['got']} gradient for a {parsed['want']} "
                       "input: a constant or astype of another dtype in backward; keep the input's dtype")
        return
    got, want = parsed["got"], parsed["want"]
    others = [name for name, shape in (shapes or {}).items() if name != result.name and tuple(shape) == tuple(got)]
    axes = _broadcast_axes(got, want)
    if len(got) == len(want) >= 2 and got == want[:-2] + (want[-1], want[-2]):
        result.hint_kind = "transpose"
        result.hint = (f"{parsed['fn']}.backward returned the transpose {got} of the expected {want}: "
                       "a weight gradient like g.T @ x instead of x.T @ g (or W vs W.T)")
    elif axes is not None:
        result.hint_kind = "broadcast_not_summed"
        summed, keep, numpy_rule = axes
        which = (f"axis {summed[0]} (g.sum(axis={summed[0]}))" if len(summed) == 1
                 else f"axes {summed} (g.sum(axis={summed}))")
        result.hint = (f"{parsed['fn']}.backward returned shape {got} for an input of shape {want}: forward "
                       f"broadcast the input, so sum the gradient over {which}"
                       + (f" with keepdims=True for the stretched size-1 axes {keep}" if keep else "")
                       + ("; autograd.unbroadcast(grad, shape) does exactly this" if numpy_rule else
                          "; forward used it with a new axis inside (like b[:, None])"))
    elif others:
        order = ", ".join(input_names) if input_names else ", ".join(shapes)
        result.hint_kind = "wrong_order"
        result.hint = (f"the gradient returned for {result.name!r} has the shape of {others[0]!r} {tuple(got)}: "
                       f"{parsed['fn']}.backward returns the gradients in another order than forward takes its "
                       f"inputs; return one gradient per input in forward's order ({order})")
    else:
        result.hint_kind = "wrong_shape"
        result.hint = f"{parsed['fn']}.backward returned a gradient of shape {got} for an input of {want}"


def _broadcast_axes(got, want):
    """How a gradient of shape ``got`` sums down to ``want``: (axes to sum, of which the size-1
    axes kept, True when NumPy's broadcasting rule explains it), or None if no sum does.

    First NumPy's rule (``want`` aligned on the right); then ``want`` found inside ``got`` in
    order, for an input that forward reshaped before broadcasting (``b[:, None]``).
    """
    extra = len(got) - len(want)
    if extra < 0:
        return None
    axes, keep, ok = list(range(extra)), [], True
    for k, (g, w) in enumerate(zip(got[extra:], want)):
        if g != w:
            if w != 1:
                ok = False
                break
            axes.append(extra + k)
            keep.append(extra + k)
    if ok:
        return (tuple(axes), tuple(keep), True) if axes else None
    positions, k = [], 0
    for axis, g in enumerate(got):  # the leftmost embedding of want in got
        if k < len(want) and g == want[k]:
            positions.append(axis)
            k += 1
    if k < len(want):
        return None
    return tuple(a for a in range(len(got)) if a not in positions), (), False
