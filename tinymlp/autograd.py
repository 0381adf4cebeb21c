"""Reverse-mode automatic differentiation: the ``Function`` contract and the backward pass.

An op is a ``Function`` subclass with two static methods on *raw arrays* (NumPy or CuPy),
as in ``torch.autograd.Function``::

    class Square(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return 2 * x * grad          # one gradient per input, of the input's shape

    y = Square.apply(t)                  # builds the graph when t requires grad

``apply`` unwraps Tensors to arrays, calls ``forward``, wraps the result in a Tensor and, when
any input requires a gradient (and grad mode is on), keeps the ``ctx`` as the node of the graph.
The ctx *is* the graph node: it records the Function, the nodes its inputs came from (not the
input tensors themselves, so that intermediate arrays backward does not need are freed during
the forward pass) and what forward saved.

``backward(root)`` walks the graph in reverse topological order, found with an explicit stack
(so a chain of 100,000 ops does not hit Python's recursion limit), calls each node's
``backward`` once with the sum of the gradients that reached its output, and accumulates the
gradients of leaf tensors into ``.grad`` (``+=`` across calls, as in PyTorch: call
``zero_grad()`` between steps). Backward never builds a graph: it is plain array code.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
import threading
import weakref

import numpy as np

from .backend import device_of
from .tensor import Tensor

__all__ = ["Context", "Function", "GradientMismatchError", "backward", "enable_grad", "is_grad_enabled", "no_grad", "unbroadcast"]


# --------------------------------------------------------------------------- the fast-tier hook
class _FastTier:
    """The one dispatch hook of the engine (filled and switched by ``tinymlp.fast``).

    ``impls[(Function, device)]`` is a drop-in implementation of a reference Function on a
    device ("cpu" or "cuda"): a subclass with the same forward/backward contract, tested
    against the reference. ``Function.apply`` runs it instead of the reference while
    ``enabled`` (``TINYMLP_FAST=0`` in the environment turns it off at import).
    """

    enabled = os.environ.get("TINYMLP_FAST", "1").strip().lower() not in ("0", "false", "no", "off")
    impls: dict = {}


_fast = _FastTier()


def _implementation(fn, arrays):
    """The class whose forward/backward run: the fast tier's, when one is registered and on."""
    if not _fast.enabled or not _fast.impls:
        return fn
    on_gpu = any(type(a).__module__.startswith("cupy") for a in arrays)
    return _fast.impls.get((fn, "cuda" if on_gpu else "cpu"), fn)


class _GradMode(threading.local):
    enabled = True


_grad_mode = _GradMode()


def is_grad_enabled() -> bool:
    """Whether new operations record a graph."""
    return _grad_mode.enabled


class _GradModeContext(contextlib.ContextDecorator):
    """Sets grad mode to ``enabled`` inside a ``with`` block or a decorated function."""

    enabled: bool

    def __enter__(self):
        self._prev = _grad_mode.enabled
        _grad_mode.enabled = self.enabled
        return self

    def __exit__(self, *exc):
        _grad_mode.enabled = self._prev
        return False

    def _recreate_cm(self):  # a fresh instance per decorated call: recursion and threads are safe
        return type(self)()


class no_grad(_GradModeContext):
    """Context manager and decorator in which operations build no graph at all."""

    enabled = False


class enable_grad(_GradModeContext):
    """Turn graph recording back on inside a ``no_grad`` region."""

    enabled = True


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


class GradientMismatchError(RuntimeError):
    """A Function's backward returned a gradient whose shape or dtype is not its input's.

    Attributes (for tools such as gradcheck): ``fn`` (the Function's name), ``index`` (which
    positional input; None for a wrong count), ``kind`` ("shape", "dtype", "count" or "type"),
    ``got`` and ``expected``.
    """

    def __init__(self, fn, index, kind, got, expected):
        self.fn, self.index, self.kind, self.got, self.expected = fn, index, kind, got, expected
        if kind == "shape":
            text = f"{fn}.backward returned a gradient of shape {got} for an input of shape {expected}"
        elif kind == "count":
            text = (f"{fn}.backward returned {got} gradient{'s' if got != 1 else ''} for {expected} "
                    f"input{'s' if expected != 1 else ''}: return one per positional input of forward, "
                    "in order (None for an input that needs none)")
        elif kind == "type":
            text = (f"{fn}.backward returned a {got} as the gradient of input {index}; backward works on "
                    f"raw arrays: return an array of the input's shape {expected} (or None)")
        else:
            text = (f"{fn}.backward returned a {got} gradient for a {expected} input "
                    "(an accidental upcast? keep constants in the input's dtype)")
        super().__init__(text)


class Context:
    """What one application of a Function remembers (the ``ctx`` of forward and backward);
    also the node of the graph.

    For forward: ``ctx.save_for_backward(*arrays)`` keeps arrays for backward, which reads
    them back as ``ctx.saved_tensors``. Attributes: ``needs_input_grad`` (a bool per positional input), ``saved_tensors``
    (what ``save_for_backward`` stored), ``input_shapes`` and ``input_dtypes`` (of the
    positional inputs; None for inputs that are not arrays), ``retain_graph`` (False while
    backward runs for the last time: the engine drops what forward saved right after, so
    backward may write its result into a saved array it owns). Forward may set other
    attributes freely (``ctx.axis = axis``) for its backward to read.

    The node does *not* keep its input tensors: only ``parents``, for each input that needs a
    gradient, the node that made it (or the leaf tensor itself). So an intermediate result
    that backward does not need (the input of a GELU that saved its derivative, a residual
    stream already added) is freed as soon as the forward pass lets go of it, as in PyTorch;
    what stays alive until backward is exactly what the ops saved.
    """

    def __init__(self, fn, args, needs_input_grad):
        self.fn = fn
        self.needs_input_grad = needs_input_grad
        self.saved_tensors = ()
        self.parents = tuple(_node_of(a) if need else None for a, need in zip(args, needs_input_grad))
        self.input_shapes = tuple(getattr(a, "shape", None) for a in args)
        self.input_dtypes = tuple(getattr(a, "dtype", None) for a in args)
        self.output = None  # a weak reference to the output tensor, set by apply
        self.retain_graph = True  # set by backward(); True = the saved arrays must stay intact

    def save_for_backward(self, *arrays):
        """Keep arrays for backward (save the cheapest sufficient thing)."""
        self.saved_tensors = arrays

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


def _node_of(t):
    """The graph node behind tensor ``t``: the Context that made it, or ``t`` itself for a leaf."""
    return t if t._ctx is None else t._ctx


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
        arrays = [a.data if isinstance(a, Tensor) else a for a in args]
        _check_same_device(cls, args, arrays)
        needs = tuple(isinstance(a, Tensor) and a.requires_grad for a in args)
        record = _grad_mode.enabled and any(needs)
        impl = _implementation(cls, arrays)   # the reference itself, or its fast-tier stand-in
        ctx = Context(impl, args, needs) if record else _NoGraphContext(len(args))
        out = impl.forward(ctx, *arrays, **kwargs)
        result = Tensor._from_op(out, ctx if record else None)
        if record:
            ctx.output = weakref.ref(result)
            ctx.fingerprints = _fingerprints(args, arrays, ctx.saved_tensors)
        return result


class _NoGraphContext:
    """The ctx that forward receives when no graph is recorded: it remembers nothing."""

    saved_tensors = ()

    def __init__(self, n):
        self.needs_input_grad = (False,) * n

    def save_for_backward(self, *arrays):
        pass


_SAMPLES = 16


def _sample(arr):
    """A few of ``arr``'s values, spread over it (a cheap fingerprint of its contents)."""
    step = max(1, arr.size // _SAMPLES)
    return arr.flat[::step][:_SAMPLES].copy()


def _fingerprints(args, arrays, saved):
    """For each input Tensor whose memory forward saved (NumPy only: reading values back from
    a GPU would stall it): (index, its array, a sample of its values). backward compares them,
    so that a saved input modified in place (``x.data[...] = ...``, an optimizer step before
    backward) is an error instead of a silently wrong gradient."""
    saved = [s for s in saved if type(s).__module__ == "numpy" and hasattr(s, "shape")]
    prints = []
    for i, (a, arr) in enumerate(zip(args, arrays)):
        if (isinstance(a, Tensor) and type(arr).__module__ == "numpy" and arr.size
                and any(np.may_share_memory(s, arr) for s in saved)):
            prints.append((i, arr, _sample(arr), a.name))
    return prints


def _check_unmodified(node):
    """Raise if an input saved by ``node``'s forward was changed in place since (see above)."""
    for i, arr, sample, name in getattr(node, "fingerprints", ()):
        now = _sample(arr)
        if not ((now == sample) | ((now != now) & (sample != sample))).all():   # NaN == NaN here
            reference = getattr(node.fn, "reference", node.fn)
            params = list(inspect.signature(reference.forward).parameters)[1:]
            what = f"input {i}" + (f" '{params[i]}'" if i < len(params) and not params[i].startswith("*") else "")
            what += f" (tensor '{name}')" if name else ""
            raise RuntimeError(
                f"{reference.__name__}: {what}, of shape {tuple(arr.shape)}, was modified in place after "
                "forward saved it for backward (e.g. x.data[...] = ..., or an optimizer step before "
                "backward()), so its gradients would be wrong; change a copy, or run backward() first"
            )


def _check_same_device(fn, args, arrays):
    """A CPU array meeting a CUDA array is a user error: say which op and which devices."""
    if "cupy" not in sys.modules:  # without CuPy every array is a NumPy array: nothing to check
        return
    devices = [device_of(arr) for a, arr in zip(args, arrays) if isinstance(a, Tensor)]
    if len(set(devices)) > 1:
        raise RuntimeError(
            f"{fn.__name__}: inputs are on different devices ({', '.join(devices)}); "
            "move them to one device first with .to(device)"
        )


def backward(root: Tensor, grad=None, retain_graph: bool = False) -> None:
    """Backpropagate from ``root``; leaf tensors that require grad accumulate into ``.grad``."""
    if not root.requires_grad:
        raise RuntimeError("backward() on a tensor that does not require grad (built under no_grad, or from constants)")
    xp = root._xp
    if grad is None:
        if root.data.size != 1:
            raise RuntimeError(
                f"backward() without a gradient needs a scalar output, got shape {root.shape}; "
                "pass backward(grad) with an array of that shape"
            )
        grad = xp.ones_like(root.data)
    else:
        grad = xp.asarray(grad.data if isinstance(grad, Tensor) else grad, dtype=root.dtype)
        if grad.shape != root.shape:
            raise RuntimeError(f"backward(): gradient of shape {grad.shape} for an output of shape {root.shape}")

    root_node = _node_of(root)
    grads = {id(root_node): grad}
    for node in _reverse_topological(root_node):
        g = grads.pop(id(node), None)
        if g is None:
            continue
        if isinstance(node, Tensor):  # a leaf: accumulate, never alias an array the graph may still share
            if node.grad is None:
                node.grad = g.copy(order="K")   # in the layout it came in
            else:
                node.grad += g
            continue
        if node.fn is None:  # _FREED, or a node an earlier backward() went through
            raise RuntimeError(
                "the graph behind this tensor was freed by an earlier backward(); "
                "call backward(retain_graph=True) the first time to backpropagate twice"
            )
        node.retain_graph = retain_graph
        _check_unmodified(node)
        in_grads = _as_gradients(node, node.fn.backward(node, g))
        for i, parent in enumerate(node.parents):
            if parent is None or in_grads[i] is None:
                continue
            ig = in_grads[i]
            shape, dtype = node.input_shapes[i], node.input_dtypes[i]
            if ig.shape != shape:
                raise GradientMismatchError(node.fn.__name__, i, "shape", tuple(ig.shape), tuple(shape))
            if ig.dtype != dtype:
                raise GradientMismatchError(node.fn.__name__, i, "dtype", str(ig.dtype), str(dtype))
            key = id(parent)
            prev = grads.get(key)
            grads[key] = ig if prev is None else prev + ig
        if not retain_graph:
            _free(node)


def _as_gradients(node, returned):
    """What backward returned, as one entry per positional input, or a clear error.

    Trailing inputs that are not arrays (a shape, an axis) may be left out, as they always get
    None; an array input may not.
    """
    name = node.fn.__name__
    grads = returned if isinstance(returned, tuple) else (returned,)
    n = len(node.parents)
    arrays = [i for i, shape in enumerate(node.input_shapes) if shape is not None]
    least = arrays[-1] + 1 if arrays else 0
    if not least <= len(grads) <= n:
        raise GradientMismatchError(name, None, "count", len(grads), n)
    for i, gr in enumerate(grads):
        if gr is not None and not (hasattr(gr, "shape") and hasattr(gr, "dtype") and not isinstance(gr, Tensor)):
            raise GradientMismatchError(name, i, "type", type(gr).__name__, node.input_shapes[i])
    return grads + (None,) * (n - len(grads))


class _FreedNode:
    """Placeholder node left behind by a freed graph, so a second backward fails clearly."""

    fn = None
    parents = ()


_FREED = _FreedNode()


def _free(ctx):
    """Drop what ``ctx`` saved and cut it out of the graph; its output tensor now points at ``_FREED``."""
    ctx.fn, ctx.parents, ctx.saved_tensors = None, (), ()
    out = ctx.output() if ctx.output is not None else None
    if out is not None:
        out._ctx = _FREED


def _reverse_topological(root):
    """Graph nodes reachable from ``root`` (Contexts, and leaf Tensors), outputs before inputs."""
    order = []
    visited = set()
    stack = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in visited:
            continue
        visited.add(id(node))
        stack.append((node, True))
        for parent in getattr(node, "parents", ()):
            if parent is not None and id(parent) not in visited:
                stack.append((parent, False))
    order.reverse()
    return order
