"""``Tensor``: an array (NumPy or CuPy) plus what autograd needs to differentiate through it.

A Tensor holds ``.data`` (the array), ``.grad`` (an array of the same shape and device once a
backward pass has reached it, else None), ``.requires_grad``, and ``_ctx``: the graph node of
the op that produced it (None for leaves and for results computed without a graph).

Operators and methods follow NumPy's names and conventions (``x.sum(axis=1, keepdims=True)``,
``x.transpose(2, 0, 1)``, ``x[idx]``, ``x @ w``) and dispatch to the ops in ``tinymlp.ops``.
That dispatch is the one place where a lower floor of the package reaches a higher one; it is
made explicit by the import at the bottom of this file.
"""

from __future__ import annotations

import numpy as np

from .backend import DEFAULT_FLOAT, array_module, check_axes, device_of, is_float_dtype, module_for_device, to_device

__all__ = ["Tensor", "tensor"]


ACCEPTED = ("tinymlp tensors hold real numbers: give a number, a (nested, rectangular) list of numbers, "
            "or a NumPy/CuPy array of bool, integer or float dtype")


def _probe(data):
    """``data`` as an array, or a TypeError/ValueError that says what tinymlp accepts."""
    if data is None:
        raise TypeError(f"tensor(): cannot make a tensor from None; {ACCEPTED}")
    try:
        return data if hasattr(data, "dtype") and hasattr(data, "shape") else np.asarray(data)
    except ValueError:  # NumPy 2 refuses ragged nested lists ("inhomogeneous shape")
        raise ValueError(f"tensor(): the nested lists are ragged (rows of different lengths); {ACCEPTED}") from None


def _check_kind(dtype, what):
    """Refuse dtypes that are not bool, integer or float (complex, strings, objects, dates)."""
    kind = np.dtype(dtype).kind
    if kind not in "biuf":
        name = {"c": "complex", "U": "string", "S": "bytes", "O": "Python objects (dtype object: None, a dict or mixed types inside)",
                "M": "datetime", "m": "timedelta", "V": "structured"}.get(kind, str(np.dtype(dtype)))
        raise TypeError(f"tensor(): {what} is {name} ({np.dtype(dtype)}); {ACCEPTED}")


def _as_array(data, dtype, device):
    """Turn ``data`` (array, list, scalar, Tensor) into an array of ``dtype`` on ``device``."""
    if isinstance(data, Tensor):
        data = data.data
    xp = module_for_device(device)
    probe = _probe(data)
    if dtype is not None:
        _check_kind(dtype, "the dtype asked for")
    if probe.dtype.kind not in "biuf":
        _check_kind(probe.dtype, "the data")
    if probe is not data:
        data = probe  # converted once: no second pass over a long list
    if dtype is None:
        if probe.dtype == np.bool_ or np.issubdtype(probe.dtype, np.integer):
            dtype = probe.dtype
        else:
            dtype = DEFAULT_FLOAT  # float32 unless asked otherwise, whatever the input's float type
    if hasattr(data, "shape"):  # an array (or array scalar): move it if it lives elsewhere
        data = to_device(data, device)
    return xp.asarray(data, dtype=dtype)


class Tensor:
    """An n-dimensional array that can record the operations applied to it."""

    __slots__ = ("data", "grad", "requires_grad", "_ctx", "name", "__weakref__")
    __array_priority__ = 1000  # so that ndarray (op) Tensor defers to Tensor's reflected operator

    def __init__(self, data, requires_grad=False, device=None, dtype=None):
        if device is None:
            device = device_of(data.data if isinstance(data, Tensor) else data)
        self.data = _as_array(data, dtype, device)
        self.grad = None
        self._ctx = None
        self.name = None
        self.requires_grad = False
        if requires_grad:
            self.requires_grad_(True)

    @classmethod
    def _from_op(cls, data, ctx):
        """Wrap an op's output array without copying (used by Function.apply)."""
        if isinstance(data, np.generic):  # NumPy reductions return scalars: keep .data an array
            data = np.asarray(data)
        t = object.__new__(cls)
        t.data = data
        t.grad = None
        t._ctx = ctx
        t.name = None
        t.requires_grad = ctx is not None
        return t

    # ----------------------------------------------------------------- properties
    @property
    def shape(self):
        return self.data.shape

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def ndim(self):
        return self.data.ndim

    @property
    def size(self):
        return self.data.size

    @property
    def device(self) -> str:
        return device_of(self.data)

    @property
    def is_leaf(self) -> bool:
        return self._ctx is None

    @property
    def _xp(self):
        return array_module(self.data)

    def __len__(self):
        return len(self.data)

    def __repr__(self):
        arr = self.numpy() if self.device != "cpu" else self.data
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
        """The same data (shared, not copied) outside the graph."""
        return Tensor._from_op(self.data, None)

    def item(self):
        """The Python number in a one-element tensor (this synchronises with the GPU)."""
        if self.data.size != 1:
            raise ValueError(f"item() needs a tensor with one element, got shape {self.shape}")
        return self.data.item()

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
        data = self.data if dtype is None else self.data.astype(dtype, copy=False)
        return data.copy() if copy else data

    def to(self, device=None, dtype=None) -> "Tensor":
        """A tensor on ``device`` and/or of ``dtype``; ``self`` when nothing changes.

        A change of dtype on a tensor that requires grad is differentiable; moving devices
        gives a new leaf (move parameters before building the graph).
        """
        out = self
        if dtype is not None and np.dtype(dtype) != self.dtype:
            out = _ops.astype(out, dtype)
        if device is not None and device_of(out.data) != _parse(device):
            moved = Tensor._from_op(to_device(out.data, device), None)
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

    # comparisons give boolean tensors outside the graph (masks, accuracy)
    def _compare(self, other, op):
        other = other.data if isinstance(other, Tensor) else other
        if hasattr(other, "shape") and type(other).__module__ != type(self.data).__module__:
            other = self._xp.asarray(other)      # a NumPy array meeting a CuPy tensor: to its device
        return Tensor._from_op(op(self.data, other), None)

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

    def __bool__(self):
        if self.data.size != 1:
            raise ValueError("the truth value of a tensor with more than one element is ambiguous")
        return bool(self.data)

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
        return Tensor._from_op(self.data.argmax(axis=axis), None)

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


def tensor(data, requires_grad=False, device="cpu", dtype=None) -> Tensor:
    """Create a leaf Tensor on ``device`` ("cpu" or "cuda").

    Floating-point data becomes float32 unless ``dtype`` says otherwise (pass
    ``dtype="float64"`` to keep double precision); integers and booleans keep their type.
    The data is copied when it has to change device or dtype, and shared otherwise.
    """
    return Tensor(data, requires_grad=requires_grad, device=device, dtype=dtype)


# The one upward hook (see the module docstring): operators dispatch to the ops, and backward()
# to the autograd engine, both of which build on the Tensor class defined above.
from . import autograd as _autograd  # noqa: E402
from . import ops as _ops  # noqa: E402
from .backend import parse_device as _parse  # noqa: E402
