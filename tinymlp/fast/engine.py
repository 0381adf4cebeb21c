"""The fast engine: the reference engine's algorithm (tinymlp/autograd.py) with fewer passes over memory.

``FastEngine`` subclasses ``autograd.Engine`` and overrides a few of its steps; the fast tier
registers it in the dispatch table (``dispatch.ENGINE``), so ``TINYMLP_FAST=0`` or
``fast.disabled()`` runs the reference engine alone, and ``fast.reference_engine()`` runs the fast
ops under the reference engine. Its savings change no result (tests/test_engine_tiers.py
compares the engines' float64 gradients on every model):

- **a pending bias** (``PendingBias``): a fast Linear may leave its bias unadded
  (``ctx.pending_bias``). The op that reads the output adds it in its own pass if it takes it
  (``takes_bias(index, x, bias, kwargs)`` on its class gives the keyword: the compiled GELU,
  GELU(x W + b) in one pass over x W; the residual sum; aMLP's gating unit); any other reader of
  the values (an op, ``.data``, printing) gets it added first, in place, once.
  ``benchmarks/step_toggles.py --toggle pending-bias`` prices it (2-5% of a small model's step).
- **early frees**: a node's backward learns whether it is its last (``last_backward(ctx)``);
  then it may write into what it saved and let go of it (``take_saved(ctx)``) before it
  allocates its results, which lowers a step's peak memory (``cpu_step.py --memory``).
- **no copy for a leaf**: the first gradient a leaf gets becomes its ``.grad`` as it is where
  nothing else holds that array (its reference count says so), where the reference engine copies:
  on a GPU that copy is one more launch a parameter, in a step the host paces.
"""

from __future__ import annotations

import sys
import threading

from ..autograd import Context, Engine, NoGraph
from ..backend import device_of
from ..tensor import Tensor

__all__ = ["FastContext", "FastEngine", "PendingBias", "last_backward", "take_saved", "takes_pending_bias"]


class FastContext(Context):
    """The node of the fast engine: ``pending_bias``, which a fast forward may set, and
    ``retain_graph``, False while the node's last backward runs."""

    pending_bias = None
    retain_graph = True


class FastNoGraph(NoGraph):
    """The ctx when no graph is recorded: a fast forward may still leave a bias pending."""

    pending_bias = None


def takes_pending_bias(ctx) -> bool:
    """Whether the engine running this forward passes on a bias it leaves pending (the fast one)."""
    return isinstance(ctx, (FastContext, FastNoGraph))


def last_backward(ctx) -> bool:
    """Whether this is the node's last backward: its saved arrays may then serve as buffers."""
    return getattr(ctx, "retain_graph", True) is False


def take_saved(ctx):
    """``ctx.saved_tensors``; on the last backward the ctx also lets go of them, so that backward
    holds the only references and can drop each array (``del``) once it has read it."""
    saved = ctx.saved_tensors
    if last_backward(ctx):
        ctx.saved_tensors = ()
    return saved


# --------------------------------------------------------------------------- a pending bias
class PendingBias(Tensor):
    """A Tensor whose op left a bias unadded: ``raw`` (the array without it) and ``bias`` (None
    once added). Its array (``_data``) stays unset until a reader needs the values; that first
    read adds the bias into ``raw`` in place and sets it. Its shape, dtype and device are raw's,
    so reading them adds nothing."""

    __slots__ = ("raw", "bias")
    _settling = threading.Lock()

    @classmethod
    def wrap(cls, raw, bias, grad_fn):
        """A tensor of the values ``raw + bias``, the sum not yet made."""
        t = object.__new__(cls)
        t.raw, t.bias, t.storage, t.grad, t.grad_fn, t.name = raw, bias, None, None, grad_fn, None
        t.requires_grad = grad_fn is not None
        return t

    def __getattr__(self, name):          # reached for the array only while it is unset
        if name != "_data":
            raise AttributeError(f"'Tensor' object has no attribute {name!r}")
        with PendingBias._settling:       # once, whichever thread reads first
            if self.bias is not None:
                self.raw += self.bias
                self.bias = None
            self._data = self.raw
        return self.raw

    shape = property(lambda self: self.raw.shape)
    dtype = property(lambda self: self.raw.dtype)
    ndim = property(lambda self: self.raw.ndim)
    size = property(lambda self: self.raw.size)
    device = property(lambda self: device_of(self.raw))


# --------------------------------------------------------------------------- the engine
class FastEngine(Engine):
    """``Engine`` with the savings of the module docstring."""

    def context(self, impl, args, arrays, needs, record):
        return FastContext(impl, args, arrays, needs) if record else FastNoGraph(len(args))

    def unwrap(self, args):
        return [(a.raw if a.__class__ is PendingBias and a.bias is not None else a.array)
                if isinstance(a, Tensor) else a for a in args]

    def forward(self, ctx, impl, args, arrays, kwargs):
        for i, a in enumerate(args):
            if a.__class__ is PendingBias and a.bias is not None:
                kwargs = self.hand_over(impl, args, arrays, kwargs, i)
        return impl.forward(ctx, *arrays, **kwargs)

    def hand_over(self, impl, args, arrays, kwargs, i):
        """Input ``i``'s pending bias, to ``impl`` under the keyword its ``takes_bias`` gives, or
        added into the array first (not to a tensor that appears twice among the inputs: x op x)."""
        a = args[i]
        takes = getattr(impl, "takes_bias", None)
        key = takes(i, a.raw, a.bias, kwargs) if takes is not None and sum(b is a for b in args) == 1 else None
        if key is None:
            arrays[i] = a.array                                   # adds it
            return kwargs
        return dict(kwargs, **{key: a.bias})

    def wrap(self, out, ctx, record):
        if ctx.pending_bias is None:
            return Tensor.from_array(out, ctx if record else None)
        return PendingBias.wrap(out, ctx.pending_bias, ctx if record else None)

    def run_backward(self, node, g, retain_graph):
        node.retain_graph = retain_graph               # False: the node's last backward (early frees)
        return node.fn.backward(node, g)

    def accumulate_leaf(self, leaf, g):
        if leaf.grad is not None:
            super().accumulate_leaf(leaf, g)
        elif g.base is None and sys.getrefcount(g) <= 3:   # names: backward's, ours, getrefcount's
            leaf.grad = g                # a fresh array nothing else holds: kept, not copied
        else:
            leaf.grad = g.copy(order="K")                   # laid out like g, as the fast ops lay it out


ENGINE = FastEngine()
