"""Reverse-mode automatic differentiation: the ``Function`` contract and the backward pass.

An op is a ``Function`` subclass with two static methods on *raw arrays* (NumPy or CuPy), as
in ``torch.autograd.Function``: ``forward`` computes the output and saves what backward needs,
``backward`` turns dL/d(output) into dL/d(input) for each input (see ``Function`` below).

``apply`` unwraps Tensors to arrays, calls ``forward``, wraps the result in a Tensor and, when
any input requires a gradient (and grad mode is on), keeps the ``ctx`` as the node of the graph.
The ctx *is* the graph node: it records the Function, the nodes its inputs came from (not the
input tensors themselves, so that intermediate arrays backward does not need are freed during
the forward pass) and what forward saved.

``backward(root)`` walks the graph in reverse topological order, calls each node's
``backward`` once with the sum of the gradients that reached its output, and accumulates the
gradients of leaf tensors into ``.grad`` (``+=`` across calls, as in PyTorch: call
``zero_grad()`` between steps). Backward never builds a graph: it is plain array code.

Six small modules stand beside this one, each one concept: ``grad_mode.py`` (``no_grad``:
whether operations record a graph), ``graph.py`` (the walk in topological order),
``contract.py`` (the errors that name a Function's mistake: a gradient of the wrong shape,
mixed precision), ``guard.py`` (refusing a backward whose saved inputs were changed in place),
``dispatch.py`` (the table in which ``apply`` finds a Function's fast implementation: the one
hook through which the fast tier, tinymlp/fast/, takes over an op) and ``handover.py`` (what
an op of the fast tier hands the op that reads its output: a bias to add, a derivative).
"""

from __future__ import annotations

import sys
import weakref

from . import contract, dispatch, graph, guard, handover
from .grad_mode import is_grad_enabled
from .tensor import Tensor

__all__ = ["Context", "Function", "backward", "unbroadcast"]


def unbroadcast(grad, shape):
    """Sum ``grad`` down to ``shape``: the gradient of a NumPy broadcast from ``shape``.

    Broadcasting prepends axes and stretches size-1 axes; its adjoint sums over exactly those.
    This one helper serves every op whose inputs broadcast.
    """
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
    """What one application of a Function remembers (the ``ctx`` of forward and backward);
    also the node of the graph.

    For forward: ``ctx.save_for_backward(*arrays)`` keeps arrays for backward, which reads
    them back as ``ctx.saved_tensors``. Attributes: ``needs_input_grad`` (a bool per positional
    input), ``saved_tensors`` (what ``save_for_backward`` stored), ``input_shapes`` and
    ``input_dtypes`` (of the positional inputs; None for inputs that are not arrays),
    ``retain_graph`` (False while backward runs for the last time: the engine drops what
    forward saved right after, so backward may write its result into a saved array it owns).
    Forward may set other attributes freely (``ctx.axis = axis``) for its backward to read.
    Two are read by ``apply`` (tinymlp/handover.py): ``ctx.pending_bias``, a vector forward has
    *not* added to its output (the fast Linear's: the next op adds it, or the first read of the
    values), and ``ctx.elementwise_derivative``, the d of a backward that is grad * d (the fast
    GELU's: the op that reads the output may multiply it in, in its own backward).

    The node does *not* keep its input tensors: only ``parents``, for each input that needs a
    gradient, the node that made it (or the leaf tensor itself). So an intermediate result
    that backward does not need (the input of a GELU that saved its derivative, a residual
    stream already added) is freed as soon as the forward pass lets go of it, as in PyTorch;
    what stays alive until backward is exactly what the ops saved.
    """

    pending_bias = elementwise_derivative = None    # the hand-overs: None unless forward sets them

    def __init__(self, fn, args, arrays, needs_input_grad):
        self.fn = fn
        self.needs_input_grad = needs_input_grad
        self.saved_tensors = ()
        self.parents = tuple([graph.node_of(a) if need else None for a, need in zip(args, needs_input_grad)])
        self.input_shapes = tuple([getattr(a, "shape", None) for a in arrays])
        self.input_dtypes = tuple([getattr(a, "dtype", None) for a in arrays])
        self.output = None  # a weak reference to the output tensor, set by apply
        self.retain_graph = True  # set by backward(); True = the saved arrays must stay intact

    def save_for_backward(self, *arrays):
        """Keep arrays for backward (save the cheapest sufficient thing)."""
        self.saved_tensors = arrays

    def gradient_so_far(self, index):
        """While backward runs: the sum of the gradients the other readers of input ``index``
        have sent it so far, if it is an array backward may add its own gradient into and then
        return (one pass over memory fewer than the engine's sum: the fast LayerNorm's, at a
        residual connection), else None."""
        sums, parent = getattr(self, "_sums", None), self.parents[index]
        prev = sums.get(id(parent)) if sums is not None and parent is not None else None
        if prev is None or not _sole(prev):
            return None
        self._taken[index] = prev
        return prev

    def pop_saved(self):
        """``saved_tensors``, for backward to unpack; on the last backward (``retain_graph``
        False) the ctx also lets go of them. Backward then holds the only references and can
        drop each array (``del``) as soon as it has read it, which lowers the peak memory of
        a training step: a Linear frees its saved input before it allocates the input's
        gradient."""
        saved = self.saved_tensors
        if not self.retain_graph:
            self.saved_tensors = ()
        return saved


class _NoGraphContext:
    """The ctx that forward receives when no graph is recorded: it remembers nothing."""

    saved_tensors = ()
    pending_bias = None

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

    * ``forward(ctx, *arrays, **options)`` computes the output from arrays and saves what
      backward needs on ``ctx``;
    * ``backward(ctx, grad)`` returns one gradient per positional input of forward, in the
      same order, each of that input's shape and dtype (a tuple when there are several; None
      for an input that needs no gradient: ``ctx.needs_input_grad[i]`` says which do). A
      broadcast input gets its gradient summed back with ``unbroadcast(grad, shape)``;
    * ``ctx`` (a ``Context``) offers ``save_for_backward(*arrays)``, ``saved_tensors``,
      ``needs_input_grad``, ``input_shapes``, ``input_dtypes``; forward may also set its own
      attributes (``ctx.axis = axis``) for backward.

    ``tinymlp.gradcheck(MyOp.apply, (x, w))`` checks backward against finite differences.
    """

    @staticmethod
    def forward(ctx, *args, **kwargs):
        """Compute the output array from the input arrays; save on ``ctx`` what backward needs.

        Receives raw arrays (``Tensor.data``), never Tensors, plus any keyword options, and
        returns one array. It must not modify its inputs in place.
        """
        raise NotImplementedError(
            "a Function needs @staticmethod forward(ctx, *arrays) returning the output array"
        )

    @classmethod
    def takes_bias(cls, index, x, bias, kwargs):
        """The keyword under which ``forward`` takes a bias that its input number ``index``
        (the array ``x``) still lacks, to add it in a pass of its own (the vector broadcast along
        x's last axis), or None: the op that made x may leave its bias pending
        (``ctx.pending_bias``). Such a forward must not save x: a later reader adds the bias into
        x's memory. None here: x gets it added first."""
        return None

    @classmethod
    def takes_derivative(cls, index, x, derivative, kwargs):
        """The keyword under which ``forward`` takes the elementwise derivative d of the op that
        made its input number ``index`` (``ctx.elementwise_derivative``: that op's backward is
        grad * d), or None. A forward that takes it promises a backward that returns, for that
        input, the gradient times d: the gradient of the op's own input (tinymlp/handover.py)."""
        return None

    @staticmethod
    def backward(ctx, grad):
        """Given ``grad`` = dL/d(output), return dL/d(input) for every positional input of forward.

        One gradient per input, in forward's order (a tuple if more than one), each with its
        input's shape and dtype, or None where ``ctx.needs_input_grad[i]`` is False. Plain
        array code: backward builds no graph.
        """
        raise NotImplementedError(
            f"{ctx.fn.__name__ if hasattr(ctx, 'fn') else 'this Function'} has no backward: define "
            "@staticmethod backward(ctx, grad) returning one gradient array per positional input of forward"
        )

    @classmethod
    def apply(cls, *args, **kwargs):
        """Run the op on Tensors (or arrays and constants): ``MyOp.apply(x, w, axis=1)``.

        Unwraps the Tensors to arrays, calls ``forward`` and wraps the result in a Tensor; when
        an input requires grad (and grad mode is on) the ``ctx`` becomes the output's node of
        the graph, so that ``backward`` is called during ``y.backward()``.
        """
        arrays = [a._array if isinstance(a, Tensor) else a for a in args]     # a pending bias not added yet
        needs = tuple([isinstance(a, Tensor) and a.requires_grad for a in args])
        record = True in needs and is_grad_enabled()
        contract.check_inputs(cls, args, arrays, kwargs, record)
        # The one hook: the fast tier's implementation of this op on this device, if it registered
        # one (tinymlp/dispatch.py), else the class itself. Same contract, tested against it.
        impl = dispatch.implementation_for(cls, arrays)
        # What the ops that made the inputs hand over (tinymlp/handover.py): a bias to add, a derivative
        arrays, kwargs, links = handover.take(impl, args, arrays, kwargs, record)
        ctx = Context(impl, args, arrays, needs) if record else _NoGraphContext(len(args))
        if links:
            ctx.parents = tuple(links.get(i, p) for i, p in enumerate(ctx.parents))
        out = impl.forward(ctx, *arrays, **kwargs)
        result = Tensor._from_op(out, ctx if record else None)
        guard.share_views(result, args, arrays)        # a view of an input shares its memory
        if record:
            ctx.output = weakref.ref(result)
            ctx.guarded = guard.record(ctx, args, arrays, kwargs)   # what backward will check is unchanged
        if ctx.pending_bias is not None:
            result._pending = ctx.pending_bias
        return result


# --------------------------------------------------------------------------- backward
def backward(root: Tensor, grad=None, retain_graph: bool = False) -> None:
    """Backpropagate from ``root``; leaf tensors that require grad accumulate into ``.grad``."""
    if not root.requires_grad:
        raise RuntimeError("backward() on a tensor that does not require grad (built under no_grad, or from constants)")
    xp = root._xp
    if grad is None:
        if root._data.size != 1:
            raise RuntimeError(
                f"backward() without a gradient needs a scalar output, got shape {root.shape}; "
                "pass backward(grad) with an array of that shape"
            )
        grad = xp.ones_like(root._data)
    else:
        grad = xp.asarray(grad.data if isinstance(grad, Tensor) else grad, dtype=root.dtype)
        if grad.shape != root.shape:
            raise RuntimeError(f"backward(): gradient of shape {grad.shape} for an output of shape {root.shape}")

    grads = {id(graph.node_of(root)): grad}      # node -> dL/d(its output), summed over its consumers
    for node in reversed(graph.nodes(root)):      # outputs first: every consumer before its inputs
        g = grads.pop(id(node), None)
        if g is None:
            continue
        if isinstance(node, Tensor):  # a leaf: accumulate, never into an array that anything else holds
            if node.grad is None:     # keep g if it is a whole array no one else holds, else copy it
                node.grad = g if g.base is None and sys.getrefcount(g) <= 2 else g.copy(order="K")
            else:
                node.grad += g
            continue
        if node.fn is None:  # graph.FREED, or a node an earlier backward() went through
            raise RuntimeError(
                "the graph behind this tensor was freed by an earlier backward(); "
                "call backward(retain_graph=True) the first time to backpropagate twice"
            )
        node.retain_graph, node._sums, node._taken = retain_graph, grads, {}
        guard.check_unmodified(node, last=not retain_graph)
        input_grads = contract.gradients(node, node.fn.backward(node, g))
        taken, node._sums, node._taken = node._taken, None, None
        for i, (parent, ig) in enumerate(zip(node.parents, input_grads)):
            if parent is not None and ig is not None:       # one per input, shapes checked
                prev = grads.get(id(parent))
                if prev is None:
                    grads[id(parent)] = ig
                elif taken.get(i) is ig:
                    pass                            # backward added its share into it (``gradient_so_far``)
                elif _sole(prev):
                    prev += ig                      # a whole array that only grads holds: no new one
                else:
                    grads[id(parent)] = prev + ig
        ig = prev = input_grads = taken = None  # (the loop's last values would hold gradients)
        if not retain_graph:
            graph.free(node)


def _sole(g):
    """Whether the gradient ``g`` is a writable array that only the engine's sums hold (counted:
    the sums, the caller's name, this argument and getrefcount's) and whose memory nothing else
    sees: a whole array, or a view of all of one that only it holds (a Linear's reshaped dL/dx)."""
    base, by_stride = g.base, sorted(range(g.ndim), key=lambda i: -g.strides[i])   # a view: each element once
    whole = base is None or (type(base) is type(g) and base.base is None and base.size == g.size and
                             sys.getrefcount(base) <= 3 and g.transpose(by_stride).flags.c_contiguous)
    return whole and getattr(g.flags, "writeable", True) and sys.getrefcount(g) <= 4
