"""``Tensor``: an array (NumPy or CuPy) plus what autograd needs to differentiate through it.

A Tensor holds ``.data`` (the array), ``.grad`` (an array of the same shape and device once a
backward pass has reached it, else None), ``.requires_grad``, and ``grad_fn``: the graph node of
the op that produced it (None for leaves and for results computed without a graph).

Operators and methods follow NumPy's names and conventions (``x.sum(axis=1, keepdims=True)``,
``x.transpose(2, 0, 1)``, ``x[idx]``, ``x @ w``) and dispatch to the ops in ``tinymlp.ops``.
That dispatch is the one place where a lower floor of the package reaches a higher one; it is
made explicit by the import at the bottom of this file.
"""

from __future__ import annotations

import numpy as np

from .backend import DEFAULT_FLOAT, array_module, as_array, check_axes, device_of, is_float_dtype, to_device

__all__ = ["Tensor", "tensor"]


def _as_array(data, dtype, device):
    """Turn ``data`` (array, list, scalar, Tensor) into an array of ``dtype`` on ``device``."""
    if isinstance(data, Tensor) and not data.requires_grad:
        data = data.data
    elif isinstance(data, Tensor) or (isinstance(data, (list, tuple)) and _holds_graph_tensor(data)):
        raise TypeError("tensor(): the data is or holds tensors that require grad, and a new tensor would cut "
                        "them off the graph (no gradient would reach them); to keep the gradient use the tensor, "
                        "or tinymlp.stack([...]) or tinymlp.concatenate([...]) for a list; for a constant, "
                        ".detach() first")
    return as_array(data, dtype, device, "tensor()")


def _holds_graph_tensor(data, depth=0) -> bool:
    """Whether a (nested) list holds a Tensor that requires grad."""
    for item in data:
        if isinstance(item, Tensor) and item.requires_grad:
            return True
        if isinstance(item, (list, tuple)) and depth < 32 and _holds_graph_tensor(item, depth + 1):
            return True
    return False


class Tensor:
    """An n-dimensional array that can record the operations applied to it.

    Attributes: ``data`` (the array), ``grad``, ``requires_grad``, ``name`` (shown in error
    messages), ``grad_fn`` (the graph node of the op that made it, None for a leaf) and
    ``storage`` (the in-place guard's record of its memory, shared with its views: tinymlp.guard).
    """

    __slots__ = ("_data", "grad", "requires_grad", "grad_fn", "name", "storage", "__weakref__")
    __array_priority__ = 1000  # so that ndarray (op) Tensor defers to Tensor's reflected operator

    def __init__(self, data, requires_grad=False, device=None, dtype=None):
        if device is None:
            device = device_of(data.data if isinstance(data, Tensor) else data)
        self._data = _as_array(data, dtype, device)
        self.storage = None
        self.grad = None
        self.grad_fn = None
        self.name = None
        self.requires_grad = False
        if requires_grad:
            self.requires_grad_(True)

    @classmethod
    def from_array(cls, array, grad_fn=None):
        """Wrap an array as it is, without a copy or a check (what ``Function.apply`` does with
        an op's output; ``grad_fn`` is its graph node, None outside the graph)."""
        if isinstance(array, np.generic):  # NumPy reductions return scalars: keep .data an array
            array = np.asarray(array)
        t = object.__new__(cls)
        t._data, t.storage, t.grad, t.grad_fn, t.name = array, None, None, grad_fn, None
        t.requires_grad = grad_fn is not None
        return t

    # ----------------------------------------------------------------- properties
    @property
    def array(self):
        """The array behind the tensor, for reading (what the engine hands to ``forward``).
        ``data`` is the same array for a caller that may write into it (see there)."""
        return self._data

    @property
    def data(self):
        """The array (NumPy or CuPy) behind the tensor, shared, outside the graph.

        Writing into it (``t.data[...] = v``, ``t.data -= lr * g``) changes the tensor without
        autograd knowing. If a graph has saved this tensor for its backward, reading ``.data``
        first lets the in-place guard take a checksum of what was saved, so that ``backward()``
        refuses a gradient computed from changed values (see ``tinymlp.guard``). On the CPU
        only: for a CUDA tensor no checksum is taken (it would read the GPU's memory back every
        step), so such a write goes unseen there; write through tinymlp instead (``t[...] = v``
        or ``t -= lr * g`` under ``no_grad``), which both devices check.
        """
        if self.storage is not None and self.storage.saves:
            _guard.before_raw_access(self.storage)
        return self._data

    @data.setter
    def data(self, value):
        """Rebind the array (a graph that saved the old one keeps the old one)."""
        device_of(value)      # refuses a CuPy array off GPU 0, as the constructor does
        self._data = value
        self.storage = None

    @property
    def shape(self):
        return self._data.shape

    @property
    def dtype(self):
        return self._data.dtype

    @property
    def ndim(self):
        return self._data.ndim

    @property
    def size(self):
        return self._data.size

    @property
    def device(self) -> str:
        return device_of(self._data)

    @property
    def is_leaf(self) -> bool:
        return self.grad_fn is None

    @property
    def xp(self):
        """The array module of the tensor's array: ``numpy`` or ``cupy``."""
        return array_module(self._data)

    def __len__(self):
        return len(self._data)

    def __repr__(self):
        arr = self.numpy() if self.device != "cpu" else self._data
        body = np.array2string(arr, precision=4, threshold=20, edgeitems=2, prefix="tensor(")
        extra = ""
        if self.dtype != DEFAULT_FLOAT:
            extra += f", dtype={self.dtype}"
        if self.device != "cpu":
            extra += f", device='{self.device}'"
        if self.requires_grad:
            extra += ", requires_grad=True"
        return f"tensor({body}{extra})"

    # ----------------------------------------------------------------- autograd
    def requires_grad_(self, flag: bool = True):
        if flag and not is_float_dtype(self.dtype):
            raise TypeError(
                f"only floating-point tensors can require grad, this one is {self.dtype}; "
                "create it with a float dtype (e.g. dtype='float32')"
            )
        self.requires_grad = bool(flag)
        return self

    def backward(self, grad=None, retain_graph: bool = False):
        """Backpropagate from this tensor into every leaf that requires grad.

        Gradients *accumulate* into ``.grad`` (``+=``), as in PyTorch: call ``zero_grad()`` on
        the leaves (or the optimizer) between steps. ``grad`` defaults to 1 for a scalar; a
        non-scalar needs it. The graph is freed afterwards unless ``retain_graph=True``.
        """
        _autograd.backward(self, grad, retain_graph=retain_graph)

    def zero_grad(self):
        self.grad = None

    def detach(self) -> "Tensor":
        """The same data (shared, not copied) outside the graph; a write into either is a
        write into both, and the in-place guard sees it through either."""
        out = Tensor.from_array(self._data, None)
        out.storage = _guard.storage_of(self)
        return out

    def item(self):
        """The Python number in a one-element tensor (this synchronises with the GPU)."""
        if self._data.size != 1:
            raise ValueError(f"item() needs a tensor with one element, got shape {self.shape}")
        return self._data.item()

    def numpy(self) -> np.ndarray:
        """The data as a NumPy array (copied off the GPU; shared on the CPU)."""
        return to_device(self.data, "cpu")

    def tolist(self):
        return self.numpy().tolist()

    def __array__(self, dtype=None, copy=None):
        """``np.asarray(t)``: the data of a CPU tensor, outside the graph (no gradient flows back
        through it). Without this NumPy would read the tensor element by element through
        ``__getitem__``. A CUDA tensor is refused: copy it to the host on purpose, ``t.numpy()``."""
        if self.device != "cpu":
            raise TypeError(f"np.asarray of a tensor on {self.device!r}: NumPy cannot read GPU memory; "
                            f"copy it to the host with .numpy()")
        data = self.data
        data = data if dtype is None else data.astype(dtype, copy=False)
        return data.copy() if copy else data

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """NumPy's ufuncs on tensors. The arithmetic ones are the tensor's operators (``array * t``
        and ``np.multiply(array, t)`` give the tinymlp op, in the graph), comparisons give boolean
        tensors, and any other ufunc runs on the arrays under the rule of ``_numpy_on_tensors``."""
        if method == "__call__" and not kwargs:
            if ufunc.__name__ in _OPERATOR_UFUNCS:
                return getattr(_ops, _OPERATOR_UFUNCS[ufunc.__name__])(*inputs)
            if ufunc.__name__ in _COMPARISON_UFUNCS:
                xp = self.xp
                arrays = [x._data if isinstance(x, Tensor) else (xp.asarray(x) if hasattr(x, "shape") else x)
                          for x in inputs]
                return Tensor.from_array(ufunc(*arrays), None)
        name = f"np.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}")
        return _numpy_on_tensors(name, getattr(ufunc, method), inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        """NumPy's functions (``np.stack``, ``np.where``, ``np.mean``, ...) on tensors: computed on
        the arrays, under the rule of ``_numpy_on_tensors``."""
        return _numpy_on_tensors(f"np.{func.__name__}", func, args, kwargs)

    def to(self, device=None, dtype=None) -> "Tensor":
        """A tensor on ``device`` and/or of ``dtype``; ``self`` when nothing changes.

        A change of dtype on a tensor that requires grad is differentiable; moving devices
        gives a new leaf (move parameters before building the graph).
        """
        out = self
        if dtype is not None and np.dtype(dtype) != self.dtype:
            out = _ops.astype(out, dtype)
        if device is not None and device_of(out._data) != _parse(device):
            moved = Tensor.from_array(to_device(out._data, device), None)
            moved.requires_grad = out.requires_grad
            out = moved
        return out

    def cpu(self):
        return self.to("cpu")

    def cuda(self):
        return self.to("cuda")

    def astype(self, dtype):
        return _ops.astype(self, dtype)

    def float(self):
        return self.astype(DEFAULT_FLOAT)

    def double(self):
        return self.astype(np.float64)

    # ----------------------------------------------------------------- arithmetic
    def __add__(self, other):
        return _ops.add(self, other)

    def __radd__(self, other):
        return _ops.add(other, self)

    def __sub__(self, other):
        return _ops.sub(self, other)

    def __rsub__(self, other):
        return _ops.sub(other, self)

    def __mul__(self, other):
        return _ops.mul(self, other)

    def __rmul__(self, other):
        return _ops.mul(other, self)

    def __truediv__(self, other):
        return _ops.div(self, other)

    def __rtruediv__(self, other):
        return _ops.div(other, self)

    def __pow__(self, other):
        return _ops.pow(self, other)

    def __rpow__(self, other):
        return _ops.pow(other, self)

    def __matmul__(self, other):
        return _ops.matmul(self, other)

    def __rmatmul__(self, other):
        return _ops.matmul(other, self)

    def __neg__(self):
        return _ops.neg(self)

    def __getitem__(self, index):
        return _ops.getitem(self, index)

    # in-place operators: ``p -= lr * p.grad`` under no_grad() changes p itself, as in PyTorch
    def __iadd__(self, other):
        return self._in_place("+=", "add", other)

    def __isub__(self, other):
        return self._in_place("-=", "subtract", other)

    def __imul__(self, other):
        return self._in_place("*=", "multiply", other)

    def __itruediv__(self, other):
        return self._in_place("/=", "true_divide", other)

    def __ipow__(self, other):
        return self._in_place("**=", "power", other)

    def __imatmul__(self, other):
        raise TypeError("x @= w: a matrix product cannot be written in place (its result has another "
                        "shape in general); write x = x @ w")

    def __setitem__(self, index, value):
        """``t[index] = value``: write into the tensor in place (the rules of ``_in_place``)."""
        self._check_writable("t[...] = value", value)
        index = tuple(i._data if isinstance(i, Tensor) else i for i in index) if isinstance(index, tuple) \
            else (index._data if isinstance(index, Tensor) else index)
        try:
            self._data[index] = self._operand(value)
        except (TypeError, ValueError) as e:
            raise (TypeError if isinstance(e, TypeError) else ValueError)(
                f"t[...] = value on a tensor of shape {self.shape} and dtype {self.dtype}: {e}") from None
        _guard.mark_written(self)

    def _in_place(self, symbol, ufunc, other):
        """``self <symbol> other`` written into self's array (the tensor object stays the same).

        As in PyTorch: allowed under ``no_grad()`` (how parameters are updated by hand) and on
        tensors that no graph involves; refused when the graph would have to record it (a leaf
        that requires grad, a result inside the graph, or an operand that requires grad, whose
        gradient would be lost). A graph that saved this tensor for backward finds out at
        ``backward()``, which refuses to use the changed values.
        """
        self._check_writable(f"x {symbol} y", other)
        value = self._operand(other)
        try:
            getattr(self.xp, ufunc)(self._data, value, out=self._data)
        except (TypeError, ValueError) as e:   # a float into an integer tensor, a shape that grows
            shape = getattr(value, "shape", ())
            raise (TypeError if isinstance(e, TypeError) else ValueError)(
                f"x {symbol} y in place, with x of shape {self.shape} ({self.dtype}) and y of shape "
                f"{tuple(shape)} ({getattr(value, 'dtype', type(value).__name__)}): the result must "
                f"fit x's shape and dtype; write x = x {symbol[:-1]} y for a new tensor") from None
        _guard.mark_written(self)
        return self

    def _check_writable(self, what, other):
        if not _grad_mode.is_grad_enabled():
            return
        if self.requires_grad and self.grad_fn is None:
            raise RuntimeError(
                f"{what} on a leaf tensor that requires grad (a parameter?) would not be recorded by autograd; "
                "to update it by hand, do it inside `with tinymlp.no_grad():`, as an optimizer does"
            )
        if self.requires_grad or (isinstance(other, Tensor) and other.requires_grad):
            raise RuntimeError(
                f"{what} in place on tensors in the graph is not recorded by autograd (the gradient would "
                f"be wrong or lost); write it as a new tensor, e.g. x = x + y instead of x += y"
            )

    def _operand(self, other):
        """``other`` as an array (or Python scalar) on this tensor's device."""
        if isinstance(other, Tensor):
            other = other._data
        if hasattr(other, "shape") and device_of(other) != self.device:
            raise RuntimeError(f"in-place write into a tensor on {self.device!r} from an array on "
                               f"{device_of(other)!r}; move it with .to({self.device!r}) first")
        return other

    # comparisons give boolean tensors outside the graph (masks, accuracy)
    def _compare(self, other, op):
        other = other._data if isinstance(other, Tensor) else other
        if hasattr(other, "shape") and type(other).__module__ != type(self._data).__module__:
            other = self.xp.asarray(other)      # a NumPy array meeting a CuPy tensor: to its device
        return Tensor.from_array(op(self._data, other), None)

    def __lt__(self, other):
        return self._compare(other, lambda a, b: a < b)

    def __le__(self, other):
        return self._compare(other, lambda a, b: a <= b)

    def __gt__(self, other):
        return self._compare(other, lambda a, b: a > b)

    def __ge__(self, other):
        return self._compare(other, lambda a, b: a >= b)

    def __eq__(self, other):
        return self._compare(other, lambda a, b: a == b)

    def __ne__(self, other):
        return self._compare(other, lambda a, b: a != b)

    __hash__ = object.__hash__  # tensors are identified by object, like PyTorch's

    def __float__(self):
        return float(self._one("float()"))

    def __int__(self):
        return int(self._one("int()"))

    def __index__(self):
        if self.dtype.kind not in "biu":
            raise TypeError(f"only an integer tensor can be used as an index, this one is {self.dtype}")
        return int(self._one("index"))

    def _one(self, what):
        """The one element's Python value, for ``float(t)``, ``int(t)`` (reads a GPU tensor back)."""
        if self._data.size != 1:
            raise TypeError(f"{what} needs a tensor with one element, got shape {self.shape}; "
                            "for the values, t.numpy() or t.tolist()")
        return self._data.item()

    def __bool__(self):
        if self._data.size != 1:
            raise ValueError("the truth value of a tensor with more than one element is ambiguous")
        return bool(self._data)

    # ----------------------------------------------------------------- math methods
    def exp(self):
        return _ops.exp(self)

    def log(self):
        return _ops.log(self)

    def sqrt(self):
        return _ops.sqrt(self)

    def tanh(self):
        return _ops.tanh(self)

    def sigmoid(self):
        return _ops.sigmoid(self)

    def relu(self):
        return _ops.relu(self)

    def sum(self, axis=None, keepdims=False):
        return _ops.sum(self, axis=axis, keepdims=keepdims)

    def mean(self, axis=None, keepdims=False):
        return _ops.mean(self, axis=axis, keepdims=keepdims)

    def max(self, axis=None, keepdims=False):
        return _ops.max(self, axis=axis, keepdims=keepdims)

    def argmax(self, axis=None):
        """Indices of the maxima (an integer tensor outside the graph)."""
        if axis is not None:
            (axis,) = check_axes("argmax", axis, self.shape)
        return Tensor.from_array(self._data.argmax(axis=axis), None)

    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return _ops.reshape(self, shape)

    def transpose(self, *axes):
        if len(axes) == 1 and (axes[0] is None or isinstance(axes[0], (tuple, list))):
            axes = axes[0]  # x.transpose((1, 0)) and x.transpose(None), as in NumPy
        return _ops.transpose(self, tuple(axes) if axes else None)

    def swapaxes(self, a, b):
        a, b = (check_axes("swapaxes", ax, self.shape)[0] for ax in (a, b))
        axes = list(range(self.ndim))
        axes[a], axes[b] = axes[b], axes[a]
        return _ops.transpose(self, tuple(axes))

    @property
    def T(self):
        return _ops.transpose(self, None)

    def flatten(self, start_axis=0):
        """Merge the axes from ``start_axis`` on into one."""
        (start_axis,) = check_axes("flatten", start_axis, self.shape) if self.ndim else (0,)
        return _ops.reshape(self, self.shape[:start_axis] + (-1,))


# ----------------------------------------------------------------------- NumPy functions on tensors
_OPERATOR_UFUNCS = {"add": "add", "subtract": "sub", "multiply": "mul", "divide": "div", "true_divide": "div",
                    "power": "pow", "matmul": "matmul", "negative": "neg"}
_COMPARISON_UFUNCS = {"less", "less_equal", "greater", "greater_equal", "equal", "not_equal"}
_TINYMLP_NAME = {  # NumPy's name -> what keeps the graph in tinymlp
    "exp": "tinymlp.exp(x) or x.exp()", "log": "tinymlp.log(x) or x.log()", "sqrt": "tinymlp.sqrt(x) or x.sqrt()",
    "tanh": "tinymlp.tanh(x) or x.tanh()", "maximum": "tinymlp.relu(x) for max(x, 0), or tinymlp.where(x > y, x, y)",
    "sum": "x.sum(axis, keepdims)", "mean": "x.mean(axis, keepdims)", "max": "x.max(axis, keepdims)",
    "amax": "x.max(axis, keepdims)", "reshape": "x.reshape(shape)", "transpose": "x.transpose(axes)",
    "swapaxes": "x.swapaxes(a, b)", "stack": "tinymlp.stack(tensors, axis)",
    "concatenate": "tinymlp.concatenate(tensors, axis)", "split": "tinymlp.split(x, sections, axis)",
    "where": "tinymlp.where(cond, a, b)", "dot": "x @ w", "square": "x * x", "abs": "tinymlp.where(x > 0, x, -x)",
}


def _tensors_in(obj):
    if isinstance(obj, Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _tensors_in(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors_in(item)


def _unwrap(obj):
    """``obj`` with every Tensor inside (lists, tuples, dicts) replaced by its array."""
    if isinstance(obj, Tensor):
        return obj.data
    if isinstance(obj, (list, tuple)):
        return type(obj)(_unwrap(item) for item in obj)
    if isinstance(obj, dict):
        return {k: _unwrap(v) for k, v in obj.items()}
    return obj


def _has_float_array(obj):
    if isinstance(obj, (list, tuple)):
        return any(_has_float_array(item) for item in obj)
    return hasattr(obj, "dtype") and getattr(obj.dtype, "kind", "") in "fc"


def _numpy_on_tensors(name, func, args, kwargs):
    """Run a NumPy function on the arrays inside the tensors, as NumPy would on arrays, unless
    that drops a gradient: when a tensor that requires grad goes in (grad mode on) and a float
    array would come out, the result could not carry the gradient back, so it is refused and
    the tinymlp op that keeps the graph is named. Results without a gradient to lose (booleans,
    indices, ``np.allclose``) and everything under ``no_grad()`` pass."""
    result = func(*_unwrap(args), **_unwrap(kwargs))
    if (_grad_mode.is_grad_enabled() and _has_float_array(result)
            and any(t.requires_grad for t in _tensors_in((args, kwargs)))):
        short = name.split(".")[1]
        use = _TINYMLP_NAME.get(short)
        use = (f"use {use}, which keeps the graph" if use else
               "use tinymlp's ops (tinymlp.exp, tinymlp.stack, x.sum, ...), or write the step as a tinymlp.Function "
               "with its own backward")
        raise TypeError(
            f"{name} on a tensor that requires grad would return a plain array and lose the gradient; {use}. "
            "For the numbers alone, call it on x.detach().numpy() or inside `with tinymlp.no_grad():`"
        )
    return result


def tensor(data, requires_grad=False, device="cpu", dtype=None) -> Tensor:
    """Create a leaf Tensor on ``device`` ("cpu" or "cuda").

    Floating-point data becomes float32 unless ``dtype`` says otherwise (pass
    ``dtype="float64"`` to keep double precision); integers and booleans keep their type.
    The data is copied when it has to change device or dtype, and shared otherwise.
    """
    return Tensor(data, requires_grad=requires_grad, device=device, dtype=dtype)


# The one upward hook (see the module docstring): operators dispatch to the ops, backward() to
# the autograd engine and writes to the in-place guard, all of which build on the Tensor class
# defined above.
from . import autograd as _autograd  # noqa: E402
from . import grad_mode as _grad_mode  # noqa: E402
from . import guard as _guard  # noqa: E402
from . import ops as _ops  # noqa: E402
from .backend import parse_device as _parse  # noqa: E402
