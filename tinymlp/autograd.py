"""Reverse-mode automatic differentiation: the ``Function`` contract and the engine.

An op is a ``Function`` subclass with two static methods on *raw arrays* (NumPy or CuPy), as in
``torch.autograd.Function``: ``forward`` computes the output and saves what backward needs,
``backward`` turns dL/d(output) into dL/d(input) for each input. The engine does two things:

- **apply**: unwrap the Tensors to arrays, run ``forward``, wrap the result in a Tensor and,
  when an input requires a gradient, keep the ``ctx`` as the node of the graph: it records the
  Function, the nodes its inputs came from (not the input tensors, so that what backward does
  not need is freed during forward) and what forward saved.
- **backward**: walk the graph in reverse topological order (outputs first), call each node's
  ``backward`` once with the sum of the gradients that reached its output, and hand each input
  its share. A leaf keeps the sum in ``.grad``, across calls too (as in PyTorch: call
  ``zero_grad()`` between steps). Backward is plain array code: it builds no graph.

``Engine`` is that algorithm, one method per step. The fast tier subclasses it
(tinymlp/fast/engine.py: fewer passes over memory, same results) and registers it in the
dispatch table (``dispatch.py``), like the fast ops; ``TINYMLP_FAST=0`` runs this engine alone.
Beside it: ``grad_mode.py`` (``no_grad``), ``graph.py`` (the walk), ``contract.py`` (errors naming
a Function's mistake) and ``guard.py`` (refusing saved inputs changed in place).
"""

from __future__ import annotations

import weakref

from . import contract, dispatch, graph, guard
from .grad_mode import is_grad_enabled
from .tensor import Tensor

__all__ = ["Context", "Engine", "Function", "NoGraph", "backward", "engine", "unbroadcast"]


def unbroadcast(grad, shape):
    """Sum ``grad`` down to ``shape``: the gradient of a NumPy broadcast from ``shape``.
    Broadcasting prepends axes and stretches size-1 axes; its adjoint sums over exactly those."""
    shape = tuple(shape)
    if grad.shape == shape:
        return grad
    extra = grad.ndim - len(shape)
    if extra:
        grad = grad.sum(axis=tuple(range(extra)))
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    if stretched:
        grad = grad.sum(axis=stretched, keepdims=True)
    return grad


# --------------------------------------------------------------------------- the graph node
class Context:
    """What one application of a Function remembers (the ``ctx``); also the node of the graph.

    For an op's author: ``save_for_backward(*arrays)``, read back as ``saved_tensors``;
    ``needs_input_grad`` (a bool per positional input), ``input_shapes`` and ``input_dtypes``
    (None for inputs that are not arrays). Forward may set attributes of its own (``ctx.axis``).
    For the engine: ``fn`` (the Function that ran), ``parents`` (for each input that needs a
    gradient, the node that made it or the leaf itself; None for the others), ``output`` (a weak
    reference to the output tensor).
    """

    def __init__(self, fn, args, arrays, needs_input_grad):
        self.fn = fn
        self.needs_input_grad = needs_input_grad
        self.saved_tensors = ()
        self.parents = tuple([graph.node_of(a) if need else None for a, need in zip(args, needs_input_grad)])
        self.input_shapes = tuple([getattr(a, "shape", None) for a in arrays])
        self.input_dtypes = tuple([getattr(a, "dtype", None) for a in arrays])
        self.output = None

    def save_for_backward(self, *arrays):
        """Keep arrays for backward (save the cheapest sufficient thing)."""
        self.saved_tensors = arrays


class NoGraph:
    """The ctx when no graph is recorded (``no_grad``, or no input needs a gradient)."""

    saved_tensors = ()

    def __init__(self, n):
        self.needs_input_grad = (False,) * n

    def save_for_backward(self, *arrays):
        pass


# --------------------------------------------------------------------------- Function
class Function:
    """Base class of every differentiable operation. Subclass it; call ``MyOp.apply(...)``.

    The contract (as in ``torch.autograd.Function``)::

        class Scale(Function):
            @staticmethod
            def forward(ctx, x, w):          # raw arrays in (NumPy or CuPy), one array out
                ctx.save_for_backward(x, w)
                return x * w

            @staticmethod
            def backward(ctx, grad):         # grad: dL/d(output), the output's shape
                x, w = ctx.saved_tensors
                return grad * w, unbroadcast(grad * x, w.shape)   # one per input, in order

        y = Scale.apply(x, w)                # Tensors in, a Tensor out, the graph recorded

    ``backward`` returns one gradient per positional input of forward, in order, each of that
    input's shape and dtype (None for an input that needs none: ``ctx.needs_input_grad[i]``); a
    broadcast input gets its gradient summed back with ``unbroadcast(grad, shape)``.
    ``tinymlp.gradcheck(MyOp.apply, (x, w))`` checks backward against finite differences.
    """

    @staticmethod
    def forward(ctx, *args, **kwargs):
        """Compute the output array from raw arrays (never Tensors) and keyword options; save on
        ``ctx`` what backward needs. It must not modify its inputs in place."""
        raise NotImplementedError("a Function needs @staticmethod forward(ctx, *arrays) returning the output array")

    @staticmethod
    def backward(ctx, grad):
        """Given ``grad`` = dL/d(output), return dL/d(input) for every positional input of
        forward (a tuple if more than one), or None where ``ctx.needs_input_grad[i]`` is False."""
        raise NotImplementedError(f"{ctx.fn.__name__ if hasattr(ctx, 'fn') else 'this Function'} has no backward: "
                                  "define @staticmethod backward(ctx, grad) returning one gradient per input")

    @classmethod
    def apply(cls, *args, **kwargs):
        """Run the op on Tensors (or arrays and constants), ``MyOp.apply(x, w, axis=1)``: a Tensor,
        recorded in the graph when an input requires grad (``Engine.apply``)."""
        return (dispatch.lookup(dispatch.ENGINE, "any") or REFERENCE).apply(cls, args, kwargs)   # engine()


# --------------------------------------------------------------------------- the engine
class Engine:
    """The algorithm, one method per step (the fast engine overrides some of them)."""

    def apply(self, fn, args, kwargs):
        """Forward through ``fn``: the output Tensor, recorded in the graph where it must be."""
        arrays = self.unwrap(args)
        needs = tuple([isinstance(a, Tensor) and a.requires_grad for a in args])
        record = True in needs and is_grad_enabled()
        contract.check_inputs(fn, args, arrays, kwargs, record)
        # The one hook of the ops: the fast tier's implementation of fn on this device, if it
        # registered one (tinymlp/dispatch.py), else fn itself. Same contract, tested against it.
        impl = dispatch.implementation_for(fn, arrays)
        ctx = self.context(impl, args, arrays, needs, record)
        out = self.forward(ctx, impl, args, arrays, kwargs)
        result = self.wrap(out, ctx, record)
        guard.share_views(result, out, args, arrays)            # a view of an input shares its memory
        if record:
            ctx.output = weakref.ref(result)
            ctx.guarded = guard.record(ctx, args, arrays, kwargs)   # what backward will check is unchanged
        return result

    def unwrap(self, args):
        """The arrays behind the Tensors among ``args``."""
        return [a.array if isinstance(a, Tensor) else a for a in args]

    def context(self, impl, args, arrays, needs, record):
        """The ``ctx`` of one application of ``impl``: a node of the graph where it is recorded."""
        return Context(impl, args, arrays, needs) if record else NoGraph(len(args))

    def forward(self, ctx, impl, args, arrays, kwargs):
        """Run the op's forward on the arrays."""
        return impl.forward(ctx, *arrays, **kwargs)

    def wrap(self, out, ctx, record):
        """The output Tensor around forward's array; ``ctx`` is its node where the graph is recorded."""
        return Tensor.from_array(out, ctx if record else None)

    def backward(self, root, grad=None, retain_graph=False):
        """Backpropagate from ``root`` into every leaf's ``.grad``."""
        grads = {id(graph.node_of(root)): contract.first_gradient(root, grad)}   # node -> dL/d(output) so far
        for node in reversed(graph.nodes(root)):               # outputs first: every consumer before its inputs
            g = grads.pop(id(node), None)
            if g is None:
                continue                                       # no gradient reached it
            if isinstance(node, Tensor):
                self.accumulate_leaf(node, g)
            else:
                self.propagate(node, g, grads, retain_graph)

    def propagate(self, node, g, grads, retain_graph):
        """Run ``node``'s backward on ``g``, dL/d(its output), and send each input its share."""
        graph.check_not_freed(node)
        guard.check_unmodified(node, last=not retain_graph)
        input_grads = contract.gradients(node, self.run_backward(node, g, retain_graph))   # one per input, checked
        for parent, ig in zip(node.parents, input_grads):
            if parent is not None and ig is not None:
                self.accumulate(grads, parent, ig)
        if not retain_graph:
            graph.free(node)

    def run_backward(self, node, g, retain_graph):
        """The op's own backward: dL/d(its inputs) from ``g``."""
        return node.fn.backward(node, g)

    def accumulate(self, grads, node, g):
        """Add ``g`` to what ``node``'s output has received: the chain rule's sum over its readers."""
        key = id(node)
        grads[key] = grads[key] + g if key in grads else g

    def accumulate_leaf(self, leaf, g):
        """Add ``g`` into the leaf's ``.grad`` (a copy the first time: ``g`` may be an array that
        another input's gradient shares)."""
        leaf.grad = g.copy() if leaf.grad is None else leaf.grad + g


REFERENCE = Engine()


def engine() -> Engine:
    """The engine that runs now: the fast tier's where it registered one (and is on), else ``REFERENCE``."""
    return dispatch.lookup(dispatch.ENGINE, "any") or REFERENCE


def backward(root: Tensor, grad=None, retain_graph: bool = False) -> None:
    """Backpropagate from ``root`` (what ``Tensor.backward`` calls)."""
    engine().backward(root, grad, retain_graph)
