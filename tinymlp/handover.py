"""What an op hands the op that reads its output, besides the output: two hand-overs, each of
which saves a pass over memory in the fast tier and changes no result.

``Function.apply`` (autograd.py) calls ``take`` on the inputs of every op it runs:

- a *pending bias*: a forward may leave a vector unadded to its output (``ctx.pending_bias``,
  the fast Linear's bias, broadcast along the last axis). The reader adds it in its own pass if
  its ``takes_bias`` gives a keyword for it (the compiled GELU: GELU(x W + b) in one pass over
  x W); every other reader of the values has it added first, in place, once (``settle``, which
  ``Tensor._data`` calls).
- an *elementwise derivative*: an op whose backward is one product, dL/dx = grad * d, with d
  saved by its forward (GELU's dy/dx) and x its first input, the only one that needs a
  gradient, offers d as ``ctx.elementwise_derivative``. A reader of its output may take d (its
  ``takes_derivative`` gives a keyword): its backward then returns dL/dx itself, d multiplied
  into the gradient it writes for that input (the spatial gating unit, in the passes that write
  dL/dz), and the engine links that input to x's node instead of the op's: the op's backward
  pass over memory is gone. The chain rule is linear, so the sum over all readers is unchanged;
  the op's own backward still runs for its other readers, and then leaves d as it is
  (``ctx.derivative_shared``) rather than writing into it.

A tensor that appears twice among one op's inputs hands over neither (x op x).
"""

from __future__ import annotations

import threading

from .tensor import Tensor

__all__ = ["settle", "take"]


def take(impl, args, arrays, kwargs, record):
    """``(arrays, kwargs, links)`` for running ``impl.forward``: the pending biases and
    derivatives it takes added to ``kwargs`` (the others' biases added into ``arrays``), and
    ``links``: input index -> the graph node that input's gradient goes to instead of the node
    that made it (only while recording a graph)."""
    links = {}
    for i, a in enumerate(args):
        if not isinstance(a, Tensor):
            continue
        node = a._ctx
        d = getattr(node, "elementwise_derivative", None) if record and node is not None else None
        if a._pending is None and d is None:
            continue                                         # nothing to hand over (the usual case)
        once = sum(b is a for b in args) == 1
        if a._pending is not None:
            bias = a._pending
            key = impl.takes_bias(i, arrays[i], bias, kwargs) if once else None
            if key is not None and bias is not None:
                kwargs = dict(kwargs, **{key: bias})
            else:
                arrays[i] = a._data
        if d is not None and once and getattr(node, "fn", None) is not None and _only_first(node.parents):
            key = impl.takes_derivative(i, arrays[i], d, kwargs)
            if key is not None:
                kwargs = dict(kwargs, **{key: d})
                links[i] = node.parents[0]
                node.derivative_shared = True
    return arrays, kwargs, links


def _only_first(parents):
    """Whether the op's first input is the only one that needs a gradient: its whole backward is
    then grad * d, and the reader that takes d leaves nothing of it undone."""
    return parents[0] is not None and all(p is None for p in parents[1:])


_SETTLING = threading.Lock()


def settle(t: Tensor) -> None:
    """Add the bias the op that made ``t`` left pending (``Context.pending_bias``) into t's
    array, in place, once (whichever thread reads first): every reader of the values but the op
    that takes the bias in its own pass (``Function.takes_bias``) goes through here."""
    with _SETTLING:
        bias, t._pending = t._pending, None
        if bias is not None:
            t._array += bias
