"""Differentiable operations: one topic per file, each op a ``Function`` subclass.

Primitives: ``elementwise``, ``reduce``, ``shape``, ``matmul``. The functions below are the
public, NumPy-named forms (also available as Tensor methods and as ``tinymlp.add`` etc.).

Constants (Python numbers, NumPy arrays) mix with tensors as in NumPy; an array constant
takes the dtype of the float tensor it meets, so a stray float64 array cannot silently turn a
float32 model into a float64 one.
"""

from __future__ import annotations

from ..backend import array_module, is_float_dtype
from ..tensor import Tensor
from .elementwise import Add, AsType, Div, Exp, Log, Mul, Neg, Pow, ReLU, Sigmoid, Sqrt, Sub, Tanh, Where
from .matmul import MatMul
from .reduce import Max, Mean, Sum
from .shape import Concatenate, GetItem, Reshape, Transpose

__all__ = [
    "add", "sub", "mul", "div", "pow", "neg", "matmul",
    "exp", "log", "sqrt", "tanh", "sigmoid", "relu", "where", "astype",
    "sum", "mean", "max", "reshape", "transpose", "getitem", "concatenate", "split", "stack",
]


def _constant(value, like: Tensor):
    """A non-Tensor operand as an array on ``like``'s device (and dtype, for float tensors)."""
    if type(value) in (int, float, bool):  # not np.float64, a float subclass that is not weak
        return value  # Python scalars are 'weak' in NumPy 2: they adopt the tensor's dtype
    xp = like._xp
    if is_float_dtype(like.dtype):
        return xp.asarray(value, dtype=like.dtype)
    return xp.asarray(value)


def _binary(fn, a, b):
    if not isinstance(a, Tensor):
        a = _constant(a, b)
    elif not isinstance(b, Tensor):
        b = _constant(b, a)
    return fn.apply(a, b)


def add(a, b):
    return _binary(Add, a, b)


def sub(a, b):
    return _binary(Sub, a, b)


def mul(a, b):
    return _binary(Mul, a, b)


def div(a, b):
    return _binary(Div, a, b)


def pow(a, b):  # noqa: A001 - NumPy's name
    return _binary(Pow, a, b)


def matmul(a, b):
    return _binary(MatMul, a, b)


def neg(x):
    return Neg.apply(x)


def exp(x):
    return Exp.apply(x)


def log(x):
    return Log.apply(x)


def sqrt(x):
    return Sqrt.apply(x)


def tanh(x):
    return Tanh.apply(x)


def sigmoid(x):
    return Sigmoid.apply(x)


def relu(x):
    return ReLU.apply(x)


def astype(x, dtype):
    return AsType.apply(x, dtype)


def where(cond, a, b):
    """Elementwise ``a if cond else b`` (cond is a constant boolean array or tensor)."""
    like = a if isinstance(a, Tensor) else b
    if not isinstance(like, Tensor):
        raise TypeError("where(cond, a, b) needs a or b to be a Tensor")
    cond = cond.data if isinstance(cond, Tensor) else like._xp.asarray(cond)
    a = a if isinstance(a, Tensor) else _constant(a, like)
    b = b if isinstance(b, Tensor) else _constant(b, like)
    return Where.apply(cond, a, b)


def sum(x, axis=None, keepdims=False):  # noqa: A001 - NumPy's name
    return Sum.apply(x, axis=axis, keepdims=keepdims)


def mean(x, axis=None, keepdims=False):
    return Mean.apply(x, axis=axis, keepdims=keepdims)


def max(x, axis=None, keepdims=False):  # noqa: A001 - NumPy's name
    return Max.apply(x, axis=axis, keepdims=keepdims)


def reshape(x, shape):
    return Reshape.apply(x, tuple(shape) if not isinstance(shape, int) else (shape,))


def transpose(x, axes=None):
    return Transpose.apply(x, axes)


def getitem(x, index):
    if isinstance(index, Tensor):
        index = index.data
    elif isinstance(index, tuple):
        index = tuple(i.data if isinstance(i, Tensor) else i for i in index)
    return GetItem.apply(x, index)


def concatenate(tensors, axis=0):
    tensors = list(tensors)
    if not tensors:
        raise ValueError("concatenate needs at least one tensor")
    return Concatenate.apply(*tensors, axis=axis)


def stack(tensors, axis=0):
    """Join tensors of one shape along a new axis."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("stack needs at least one tensor")
    ndim = tensors[0].ndim + 1
    axis = axis % ndim
    expanded = [reshape(t, t.shape[:axis] + (1,) + t.shape[axis:]) for t in tensors]
    return concatenate(expanded, axis=axis)


def split(x, indices_or_sections, axis=0):
    """Split ``x`` along ``axis`` as ``numpy.split`` does; each piece is a differentiable slice."""
    n = x.shape[axis]
    if isinstance(indices_or_sections, int):
        if n % indices_or_sections:
            raise ValueError(f"split: axis {axis} of size {n} does not divide into {indices_or_sections} equal parts")
        step = n // indices_or_sections
        bounds = list(range(step, n, step))
    else:
        bounds = list(indices_or_sections)
    edges = [0, *bounds, n]
    axis = axis % x.ndim
    lead = (slice(None),) * axis
    return [getitem(x, lead + (slice(lo, hi),)) for lo, hi in zip(edges[:-1], edges[1:])]
