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
import zlib

import numpy as np

from .backend import array_module, device_of
from .tensor import Tensor

__all__ = ["Context", "Function", "GradientMismatchError", "MixedPrecisionError", "backward", "enable_grad", "is_grad_enabled", "no_grad", "unbroadcast"]


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


class MixedPrecisionError(TypeError):
    """An op's input that requires grad meets a wider float input (float32 and float64), so its
    gradient would come back in the wider dtype. Attributes: ``fn``, ``name`` and ``dtype`` (the
    narrower input), ``other`` and ``widest``."""

    def __init__(self, fn, name, dtype, other, widest):
        self.fn, self.name, self.dtype, self.other, self.widest = fn, name, np.dtype(dtype), other, np.dtype(widest)
        super().__init__(
            f"{fn}: {name} is {dtype} but {other} is {widest}, so the result and the gradient of {name} would "
            f"be {widest}; convert them to one precision first (x.float() for float32, x.double() for float64)"
        )


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
        arrays = [a._data if isinstance(a, Tensor) else a for a in args]
        _check_inputs(cls, args, arrays, kwargs)
        needs = tuple(isinstance(a, Tensor) and a.requires_grad for a in args)
        record = _grad_mode.enabled and any(needs)
        impl = _implementation(cls, arrays)   # the reference itself, or its fast-tier stand-in
        ctx = Context(impl, args, needs) if record else _NoGraphContext(len(args))
        out = impl.forward(ctx, *arrays, **kwargs)
        result = Tensor._from_op(out, ctx if record else None)
        _share_views(result, args, arrays)
        if record:
            ctx.output = weakref.ref(result)
            ctx.guarded = _guard(ctx, args, arrays)
        return result


class _NoGraphContext:
    """The ctx that forward receives when no graph is recorded: it remembers nothing."""

    saved_tensors = ()

    def __init__(self, n):
        self.needs_input_grad = (False,) * n

    def save_for_backward(self, *arrays):
        pass


# --------------------------------------------------------------------------- the in-place guard
# A gradient computed from values that changed after forward saved them is wrong, silently.
# The guard refuses such a backward. It follows every write into a saved input, by two routes:
#
# - writes tinymlp makes (in-place operators, t[i] = v, optimizer steps, load_state_dict): each
#   bumps the ``version`` of the tensor's memory (shared with the views and detached copies of
#   the tensor); forward records the version of every input whose memory it saved, backward
#   compares;
# - writes through the raw array (``t.data[...] = v``, ``t.data -= lr * g``): the array is
#   reached through ``t.data``, and that first read after a save takes a checksum (CRC-32) of
#   the saved memory, before the caller can write; backward takes it again and compares.
#
# Nothing is copied and nothing is read in a step that does neither (the cost is a few small
# objects per saved input). Not seen: a write through an array taken from ``.data`` *before*
# the forward pass that saved it.
#
# The checksum route is CPU-only: on the GPU the versions are checked (writes through tinymlp
# are refused on both devices), but no checksum is taken (it would read device memory back
# and stall every step), so a write through ``t.data`` of a CUDA tensor is not seen there.


class Storage:
    """What the in-place guard knows of one tensor's memory (shared by its views).

    ``version`` counts the writes made through tinymlp; ``saves`` lists a ``_Saved`` for each
    graph node that saved this memory and has not run its (last) backward yet."""

    __slots__ = ("version", "saves")

    def __init__(self):
        self.version = 0
        self.saves = []


class _Saved:
    """One input whose memory forward saved: enough for backward to tell whether it changed."""

    __slots__ = ("index", "array", "storage", "version", "name", "checksum", "node")

    def __init__(self, index, array, storage, name, node):
        self.index, self.array, self.storage, self.name = index, array, storage, name
        self.version = storage.version
        self.checksum = None
        self.node = weakref.ref(node)

    def pending(self):
        """Whether the node that saved the array may still run backward."""
        node = self.node()
        return node is not None and node.fn is not None


def storage_of(t: Tensor) -> Storage:
    """The guard's record of ``t``'s memory, made on first use."""
    if t._storage is None:
        t._storage = Storage()
    return t._storage


def mark_written(t: Tensor) -> None:
    """Record a write into ``t``'s memory made through tinymlp (an in-place operator, an
    optimizer step): a backward that needs the old values will refuse to run."""
    if t._storage is not None:
        t._storage.version += 1


def before_raw_access(storage: Storage) -> None:
    """Called by ``Tensor.data`` when a graph saved that memory: checksum it before the caller
    can write through the raw array (once per saving node), and forget finished nodes.
    CPU arrays only: a CuPy array is not checksummed (it would stall the GPU), so a write
    through ``.data`` of a CUDA tensor is not caught."""
    pending = [s for s in storage.saves if s.pending()]
    sums = {}
    for s in pending:
        if s.checksum is None and type(s.array).__module__ == "numpy":
            key = id(s.array)
            if key not in sums:
                sums[key] = _checksum(s.array)
            s.checksum = sums[key]
    storage.saves = pending


def _owner(arr):
    """The array that owns ``arr``'s memory (NumPy and CuPy point a view's ``base`` at it)."""
    base = getattr(arr, "base", None)
    return arr if base is None else base


def _shares(a, b):
    """Whether arrays ``a`` and ``b`` may overlap: only views of one owner can, and for those
    the array module's ``may_share_memory`` decides (a bounds test on the host, no device read)."""
    if a is b:
        return True
    if type(a) is not type(b) or _owner(a) is not _owner(b):
        return False
    may_share = getattr(array_module(a), "may_share_memory", None)
    return may_share(a, b) if may_share is not None else True


def _checksum(arr) -> int:
    return zlib.crc32(memoryview(np.ascontiguousarray(arr)).cast("B"))


def _guard(ctx, args, arrays):
    """For each input Tensor whose memory forward saved: a ``_Saved`` record, also listed on
    the tensor's storage (so that ``.data`` can checksum it before a raw write)."""
    saved = ctx.saved_tensors
    if not saved:
        return ()
    records = []
    for i, a in enumerate(args):
        if not isinstance(a, Tensor):
            continue
        arr = arrays[i]
        for s in saved:                  # the usual case: forward saved the input itself
            if s is arr:
                break
        else:                            # or a view of its memory (a reshape, a transpose)
            if not arr.size:
                continue
            owner = _owner(arr)
            if not any(hasattr(s, "dtype") and _owner(s) is owner and _shares(s, arr) for s in saved):
                continue
        storage = a._storage if a._storage is not None else storage_of(a)
        if len(storage.saves) > 8:                     # graphs dropped without backward
            storage.saves = [s for s in storage.saves if s.pending()]
        record = _Saved(i, arr, storage, a.name, ctx)
        storage.saves.append(record)
        records.append(record)
    return records


def _share_views(result, args, arrays):
    """An output that is a view of an input (a reshape, a slice) shares its input's storage:
    a write into one is a write into the other."""
    out = result._data
    if getattr(out, "base", None) is None:     # owns its memory: a new array
        return
    for a, arr in zip(args, arrays):
        if isinstance(a, Tensor) and _shares(out, arr):
            result._storage = storage_of(a)
            return


def _check_unmodified(node):
    """Raise if an input saved by ``node``'s forward was changed in place since (see above)."""
    for s in getattr(node, "guarded", ()):
        if s.storage.version != s.version:
            how = "by an in-place operation (x -= ..., x[i] = ..., or an optimizer step before backward())"
        elif s.checksum is not None and _checksum(s.array) != s.checksum:
            how = "through its array (x.data[...] = ..., x.data -= ...)"
        else:
            continue
        reference = getattr(node.fn, "reference", node.fn)
        what = _input_name(reference, s.index) + (f" (tensor '{s.name}')" if s.name else "")
        raise RuntimeError(
            f"{reference.__name__}: {what}, of shape {tuple(s.array.shape)}, was modified in place {how} "
            "after forward saved it for backward, so its gradients would be wrong; change a copy, "
            "or run backward() first"
        )


def _input_name(fn, i):
    """"input 1 'weight'": positional input ``i`` of ``fn.forward``, by number and name."""
    fn = getattr(fn, "reference", fn)
    try:
        params = list(inspect.signature(fn.forward).parameters)[1:]
    except (TypeError, ValueError):
        params = []
    return f"input {i}" + (f" '{params[i]}'" if i < len(params) and not params[i].startswith("*") else "")


def _release(node):
    """The node ran its last backward: its records leave the storages' lists."""
    for s in getattr(node, "guarded", ()):
        if s in s.storage.saves:
            s.storage.saves.remove(s)


def _check_inputs(fn, args, arrays, kwargs):
    """Refuse, at forward and naming the op, what backward would otherwise trip over later:
    a Tensor among the keyword options (it would get no gradient), an input that requires grad
    meeting a wider float (float32 meeting float64: the result would be float64, and the float32
    input's gradient with it), a CPU array meeting a CUDA array."""
    for key, value in kwargs.items():
        if isinstance(value, Tensor):
            raise TypeError(
                f"{fn.__name__}.apply: the tensor {key!r} was passed by keyword; pass tensors positionally, "
                f"in forward's order (keyword arguments are options: a tensor there would get no gradient)"
            )
    dtypes = [d if isinstance(d := getattr(arr, "dtype", None), np.dtype) else None for arr in arrays]
    if _grad_mode.enabled and len(set(dtypes) - {None}) > 1:     # several dtypes: look closer
        floats = [(i, dtype) for i, dtype in enumerate(dtypes) if dtype is not None and dtype.kind == "f"]
    else:
        floats = ()
    if len(floats) > 1:
        j, widest = max(floats, key=lambda f: f[1].itemsize)
        for i, dtype in floats:   # the output is `widest`: a narrower input's gradient would be too
            if dtype.itemsize < widest.itemsize and isinstance(args[i], Tensor) and args[i].requires_grad:
                raise MixedPrecisionError(fn.__name__, _input_name(fn, i), dtype, _input_name(fn, j), widest)
    if "cupy" not in sys.modules:  # without CuPy every array is a NumPy array: nothing more to check
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
            _release(node)
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
