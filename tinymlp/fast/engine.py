"""The fast engine: the reference engine's algorithm (tinymlp/autograd.py) with fewer passes over memory.

``FastEngine`` subclasses ``autograd.Engine`` and overrides a few of its steps; the fast tier
registers it in the dispatch table (``dispatch.ENGINE``), so ``TINYMLP_FAST=0`` or
``fast.disabled()`` runs the reference engine alone. Every saving below changes no result
(tests/test_engine_tiers.py compares both engines' float64 gradients on every model), and each is
one switch in ``benchmarks/step_toggles.py``:

- **a pending bias** (``PendingBias``): a fast Linear may leave its bias unadded
  (``ctx.pending_bias``). The op that reads the output adds it in its own pass if it takes it
  (``takes_bias(index, x, bias, kwargs)`` on its class gives the keyword: the compiled GELU,
  GELU(x W + b) in one pass over x W; the residual sum); any other reader of the values (an op,
  ``.data``, printing) gets it added first, in place, once.
- **a derivative handed over**: an op whose backward is dL/dx = grad * d with d saved (GELU's
  dy/dx) offers d (``ctx.elementwise_derivative``). An op reading its output may take d
  (``takes_derivative``): its backward then returns dL/dx itself, the engine links that input
  to x's node, and the op's own backward pass drops out. The chain rule is linear, so the sum
  over the readers is unchanged; the op's backward still runs for its other readers, leaving
  d as it is (``ctx.derivative_shared``).
- **sums in place**: two gradients that meet are added into the first where only the engine
  holds it (``sole``: its reference count says so), not into a new array; a leaf keeps the
  first gradient it gets where nothing else holds it, instead of a copy.
- **the sum added by the op** (Chainer's ``backward_accumulate``): an op whose class has
  ``backward_into(ctx, grad, into)`` is handed the sum of the gradients its input 0 has received
  so far, where only the engine holds it, and adds its dx into it (the compiled LayerNorm, at a
  residual connection): one pass instead of two.
- **early frees**: a node's backward learns whether it is its last (``last_backward(ctx)``);
  then it may write into what it saved and let go of it (``take_saved(ctx)``) before it
  allocates its results, which lowers a step's peak memory.
"""

from __future__ import annotations

import sys
import threading

from .. import contract, graph, guard
from ..autograd import Context, Engine, NoGraph
from ..backend import device_of
from ..tensor import Tensor

__all__ = ["FastContext", "FastEngine", "PendingBias", "last_backward", "sole", "take_saved", "takes_pending_bias"]


class FastContext(Context):
    """The node of the fast engine: the hand-overs a fast forward may set, None unless it does,
    and ``retain_graph``, False while the node's last backward runs."""

    pending_bias = elementwise_derivative = None
    derivative_shared = False
    retain_graph = True


class FastNoGraph(NoGraph):
    """The ctx when no graph is recorded: a fast forward may still leave a bias pending."""

    pending_bias = elementwise_derivative = None


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


def _take_bias(impl, i, a, arrays, kwargs):
    """``kwargs`` with input ``i``'s pending bias under the keyword ``impl`` takes it by, or, where
    it does not, the bias added into the array first (``arrays[i]``)."""
    takes = getattr(impl, "takes_bias", None)
    key = takes(i, a.raw, a.bias, kwargs) if takes is not None else None
    if key is None:
        arrays[i] = a.array                                   # adds it
        return kwargs
    return dict(kwargs, **{key: a.bias})


def _take_derivative(impl, ctx, i, node, arrays, kwargs):
    """``kwargs`` with the derivative ``node`` offers, where ``impl`` takes it for input ``i`` (its
    backward then returns the gradient of node's own input: ``ctx.parents[i]`` becomes that
    input's node)."""
    takes = getattr(impl, "takes_derivative", None)
    if takes is None or node.fn is None or node.parents[0] is None or any(p is not None for p in node.parents[1:]):
        return kwargs                                         # node's backward is more than grad * d
    key = takes(i, arrays[i], node.elementwise_derivative, kwargs)
    if key is None:
        return kwargs
    ctx.parents = ctx.parents[:i] + (node.parents[0],) + ctx.parents[i + 1:]
    node.derivative_shared = True
    return dict(kwargs, **{key: node.elementwise_derivative})


# --------------------------------------------------------------------------- sums in place
def sole(g) -> bool:
    """Whether the gradient ``g`` is a writable array that only the engine's sums hold (counted:
    the sums, the caller's name, this argument and getrefcount's) and whose memory nothing else
    sees: a whole array, or a view of all of one that only it holds (a Linear's reshaped dL/dx)."""
    base, by_stride = g.base, sorted(range(g.ndim), key=lambda i: -g.strides[i])   # a view: each element once
    whole = base is None or (type(base) is type(g) and base.base is None and base.size == g.size and
                             sys.getrefcount(base) <= 3 and g.transpose(by_stride).flags.c_contiguous)
    return whole and getattr(g.flags, "writeable", True) and sys.getrefcount(g) <= 4


# --------------------------------------------------------------------------- the engine
class FastEngine(Engine):
    """``Engine`` with the savings of the module docstring."""

    def __init__(self):
        self.adds_into = {}        # Function class -> whether it has a backward_into

    def context(self, impl, args, arrays, needs, record):
        return FastContext(impl, args, arrays, needs) if record else FastNoGraph(len(args))

    def unwrap(self, args):
        return [(a.raw if a.__class__ is PendingBias and a.bias is not None else a.array)
                if isinstance(a, Tensor) else a for a in args]

    def forward(self, ctx, impl, args, arrays, kwargs):
        for i, a in enumerate(args):
            if isinstance(a, Tensor):
                pending = a.__class__ is PendingBias and a.bias is not None
                node = a.grad_fn
                offers = node is not None and getattr(node, "elementwise_derivative", None) is not None
                if pending or offers:
                    kwargs = self.hand_over(ctx, impl, args, arrays, kwargs, i, pending, offers)
        return impl.forward(ctx, *arrays, **kwargs)

    def hand_over(self, ctx, impl, args, arrays, kwargs, i, pending, offers):
        """What the op that made input ``i`` hands ``impl``: its pending bias, its derivative
        (not to a tensor that appears twice among the inputs: x op x)."""
        once = sum(b is args[i] for b in args) == 1
        if pending and once:
            kwargs = _take_bias(impl, i, args[i], arrays, kwargs)
        elif pending:
            arrays[i] = args[i].array                        # adds it
        if offers and once and isinstance(ctx, FastContext):
            kwargs = _take_derivative(impl, ctx, i, args[i].grad_fn, arrays, kwargs)
        return kwargs

    def wrap(self, out, ctx, record):
        if ctx.pending_bias is None:
            return Tensor.from_array(out, ctx if record else None)
        return PendingBias.wrap(out, ctx.pending_bias, ctx if record else None)

    def propagate(self, node, g, grads, retain_graph):
        graph.check_not_freed(node)
        guard.check_unmodified(node, last=not retain_graph)
        node.retain_graph = retain_graph
        into = self.offer_sum(node, grads)
        returned = node.fn.backward(node, g) if into is None else node.fn.backward_into(node, g, into)
        input_grads = contract.gradients(node, returned)
        for i, (parent, ig) in enumerate(zip(node.parents, input_grads)):
            if parent is not None and ig is not None and not (i == 0 and ig is into):
                self.accumulate(grads, parent, ig)
        if not retain_graph:
            graph.free(node)

    def offer_sum(self, node, grads):
        """The sum so far of input 0's gradient, for a backward that adds into it, or None."""
        fn = node.fn
        if fn not in self.adds_into:
            self.adds_into[fn] = hasattr(fn, "backward_into")
        if not self.adds_into[fn] or node.parents[0] is None:
            return None
        so_far = grads.get(id(node.parents[0]))
        return so_far if so_far is not None and sole(so_far) else None

    def accumulate(self, grads, node, g):
        key = id(node)
        so_far = grads.get(key)
        if so_far is None:
            grads[key] = g
        elif sole(so_far):
            so_far += g                         # a whole array only the sums hold: no new one
        else:
            grads[key] = so_far + g

    def accumulate_leaf(self, leaf, g):
        if leaf.grad is not None:
            leaf.grad += g
        elif g.base is None and sys.getrefcount(g) <= 3:     # the caller's name, ours, getrefcount's
            leaf.grad = g
        else:
            leaf.grad = g.copy(order="K")


ENGINE = FastEngine()
