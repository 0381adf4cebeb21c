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
The ctx *is* the graph node: it records the Function, its input Tensors and what forward saved.

``backward(root)`` walks the graph in reverse topological order, found with an explicit stack
(so a chain of 100,000 ops does not hit Python's recursion limit), calls each node's
``backward`` once with the sum of the gradients that reached its output, and accumulates the
gradients of leaf tensors into ``.grad`` (``+=`` across calls, as in PyTorch: call
``zero_grad()`` between steps). Backward never builds a graph: it is plain array code.
"""

from __future__ import annotations

import contextlib
import sys
import threading

from .backend import device_of
from .tensor import Tensor

__all__ = ["Context", "Function", "backward", "enable_grad", "is_grad_enabled", "no_grad", "unbroadcast"]


class _GradMode(threading.local):
    enabled = True


_grad_mode = _GradMode()


def is_grad_enabled() -> bool:
    """Whether new operations record a graph."""
    return _grad_mode.enabled


class no_grad(contextlib.ContextDecorator):
    """Context manager and decorator in which operations build no graph at all."""

    def __enter__(self):
        self._prev = _grad_mode.enabled
        _grad_mode.enabled = False
        return self

    def __exit__(self, *exc):
        _grad_mode.enabled = self._prev
        return False

    def _recreate_cm(self):  # a fresh instance per decorated call: recursion and threads are safe
        return type(self)()


class enable_grad(contextlib.ContextDecorator):
    """Turn graph recording back on inside a ``no_grad`` region."""

    def __enter__(self):
        self._prev = _grad_mode.enabled
        _grad_mode.enabled = True
        return self

    def __exit__(self, *exc):
        _grad_mode.enabled = self._prev
        return False

    def _recreate_cm(self):  # a fresh instance per decorated call: recursion and threads are safe
        return type(self)()


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


class Context:
    """What one application of a Function remembers; also the node of the graph.

    Attributes: ``needs_input_grad`` (a bool per positional input), ``saved_tensors``
    (what ``save_for_backward`` stored). Forward may set other attributes freely
    (``ctx.axis = axis``) for its backward to read.
    """

    def __init__(self, fn, inputs, needs_input_grad):
        self.fn = fn
        self.inputs = inputs  # the positional inputs (Tensors or constants)
        self.needs_input_grad = needs_input_grad
        self.saved_tensors = ()

    def save_for_backward(self, *arrays):
        """Keep arrays for backward (save the cheapest sufficient thing)."""
        self.saved_tensors = arrays


class Function:
    """Base class of every differentiable operation. Subclass it; call ``MyOp.apply(...)``."""

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError

    @classmethod
    def apply(cls, *args, **kwargs):
        arrays = [a.data if isinstance(a, Tensor) else a for a in args]
        record = _grad_mode.enabled and any(isinstance(a, Tensor) and a.requires_grad for a in args)
        _check_same_device(cls, args, arrays)
        if record:
            needs = tuple(isinstance(a, Tensor) and a.requires_grad for a in args)
            ctx = Context(cls, args, needs)
        else:
            ctx = Context(cls, (), (False,) * len(args))
        out = cls.forward(ctx, *arrays, **kwargs)
        return Tensor._from_op(out, ctx if record else None)


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
        grad = grad.data if isinstance(grad, Tensor) else xp.asarray(grad, dtype=root.dtype)
        if grad.shape != root.shape:
            raise RuntimeError(f"backward(): gradient of shape {grad.shape} for an output of shape {root.shape}")

    grads = {id(root): grad}
    for node in _reverse_topological(root):
        g = grads.pop(id(node), None)
        if g is None:
            continue
        ctx = node._ctx
        if ctx is None:  # a leaf: accumulate, never alias an array the graph may still share
            if node.grad is None:
                node.grad = g.copy()
            else:
                node.grad += g
            continue
        if ctx is _FREED:
            raise RuntimeError(
                "the graph behind this tensor was freed by an earlier backward(); "
                "call backward(retain_graph=True) the first time to backpropagate twice"
            )
        in_grads = ctx.fn.backward(ctx, g)
        if not isinstance(in_grads, tuple):
            in_grads = (in_grads,)
        inputs = ctx.inputs
        if len(in_grads) < len(inputs):
            in_grads = in_grads + (None,) * (len(inputs) - len(in_grads))
        for inp, need, ig in zip(inputs, ctx.needs_input_grad, in_grads):
            if not need or ig is None:
                continue
            if ig.shape != inp.shape:
                raise RuntimeError(
                    f"{ctx.fn.__name__}.backward returned a gradient of shape {tuple(ig.shape)} "
                    f"for an input of shape {inp.shape}"
                )
            if ig.dtype != inp.dtype:
                raise RuntimeError(
                    f"{ctx.fn.__name__}.backward returned a {ig.dtype} gradient for a {inp.dtype} input "
                    "(an accidental upcast? keep constants in the input's dtype)"
                )
            key = id(inp)
            prev = grads.get(key)
            grads[key] = ig if prev is None else prev + ig
        if not retain_graph:
            node._ctx = _FREED  # drops the ctx and all it saved


class _FreedNode:
    """Placeholder node left behind by a freed graph, so a second backward fails clearly."""

    inputs = ()
    needs_input_grad = ()


_FREED = _FreedNode()


def _reverse_topological(root):
    """Tensors reachable from ``root`` through nodes that need grad, outputs before inputs."""
    order = []
    visited = set()
    stack = [(root, False)]
    while stack:
        t, expanded = stack.pop()
        if expanded:
            order.append(t)
            continue
        if id(t) in visited:
            continue
        visited.add(id(t))
        stack.append((t, True))
        ctx = t._ctx
        if ctx is not None:
            for inp, need in zip(ctx.inputs, ctx.needs_input_grad):
                if need and id(inp) not in visited:
                    stack.append((inp, False))
    order.reverse()
    return order
